"""structlog setup shared by every service: one JSON object per line in production, a readable
console renderer on a terminal, and the standard library's loggers (grpc, redis, asyncio) routed
through the same renderer so a log file never mixes formats.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import orjson
import structlog
from structlog.typing import Processor, WrappedLogger

from services.runtime.config import LogFormat


def configure_logging(service: str, instance: str, level: str, fmt: LogFormat) -> None:
    """Configure structlog (and stdlib logging) for this process; every line carries ``service``
    and ``instance``. ``fmt="auto"`` picks JSON unless stdout is a terminal."""
    numeric_level = logging.getLevelNamesMapping()[level.upper()]
    as_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())

    def add_identity(
        _logger: WrappedLogger, _method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event_dict.setdefault("service", service)
        event_dict.setdefault("instance", instance)
        return event_dict

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_identity,
    ]
    if as_json:
        # orjson returns bytes: structlog's own loggers write them directly, stdlib needs str.
        # Structured tracebacks, without frame locals: they can be huge and may hold payloads.
        shared.append(
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
        )
        ours: Processor = structlog.processors.JSONRenderer(serializer=orjson.dumps)
        foreign: Processor = structlog.processors.JSONRenderer(serializer=_orjson_text)
        logger_factory: Any = structlog.BytesLoggerFactory()
    else:
        ours = foreign = structlog.dev.ConsoleRenderer()
        logger_factory = structlog.PrintLoggerFactory()

    structlog.configure(
        processors=[*shared, ours],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=logger_factory,
        cache_logger_on_first_use=True,
    )

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, foreign],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)


def _orjson_text(obj: Any, **kwargs: Any) -> str:
    return orjson.dumps(obj, **kwargs).decode()
