"""The dashboard's HTTP routes (starlette): the page and its static files, the current summary as
JSON, and a server-sent event stream of summaries. Nothing is built or fetched from elsewhere:
the page is plain HTML, CSS and JavaScript shipped inside this package."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles


class SummarySource(Protocol):
    """What the routes read from the dashboard service: the current summary (JSON bytes), its
    version, a wait for the next one, and whether the service is closing."""

    @property
    def summary(self) -> bytes: ...

    @property
    def version(self) -> int: ...

    @property
    def closing(self) -> asyncio.Event: ...

    async def wait_for_update(self, seen: int) -> None: ...


STATIC = ("services.dashboard", "static")


def build_app(service: SummarySource) -> Starlette:
    static = StaticFiles(packages=[STATIC])
    index = static.lookup_path("index.html")[0]

    async def page(request: Request) -> Response:
        return FileResponse(index, media_type="text/html")

    async def summary(request: Request) -> Response:
        return Response(service.summary, media_type="application/json")

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[ServerSentEvent]:
            # Each message is the whole (bounded) summary, so a browser that missed some, or
            # joined late, is current after one.
            seen = -1
            while not service.closing.is_set():
                if service.version != seen:
                    seen = service.version
                    yield ServerSentEvent(data=service.summary.decode(), event="summary")
                await service.wait_for_update(seen)

        return EventSourceResponse(stream(), ping=15)

    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/summary", summary),
            Route("/api/events", events),
            Route("/healthz", health),
            Mount("/static", static, name="static"),
        ]
    )
