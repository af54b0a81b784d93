"""The dashboard's HTTP routes (starlette): the page and its static files, the current summary as
JSON, and a server-sent event stream of summaries. Nothing is built or fetched from elsewhere:
the page is plain HTML, CSS and JavaScript shipped inside this package.

Served over HTTPS, every route but ``/healthz`` is the admin's: the summary is the whole
cluster — every queue's usage, pending pods' reasons, movements — which a tenant's own view (the
public API) does not show it. Who a connection is comes from its client certificate
(``Callers``, filled by the service as connections are made).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from foundation.tls import ADMIN, Identity

Callers = dict[tuple[str, int], Identity]
"""Whom the client certificate of each open connection names, by the client's address."""

ADMIN_ONLY = (
    "the dashboard shows every tenant's work: it is the admin's (present the admin "
    "certificate; `godel certs export` writes admin.p12 for a browser)"
)
OPEN_PATHS = frozenset({"/healthz"})


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


class _AdminOnly:
    """Refuses (403) every request but to ``OPEN_PATHS`` on a connection whose certificate is
    not the admin's."""

    def __init__(self, app: ASGIApp, callers: Callers) -> None:
        self.app = app
        self.callers = callers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            client = scope.get("client")
            caller = self.callers.get((client[0], client[1])) if client else None
            if caller is None or caller.role != ADMIN:
                await PlainTextResponse(ADMIN_ONLY, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(service: SummarySource, callers: Callers | None = None) -> Starlette:
    """The routes; with ``callers`` (HTTPS), for the admin's connections only."""
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
        ],
        middleware=[Middleware(_AdminOnly, callers=callers)] if callers is not None else [],
    )
