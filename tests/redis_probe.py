"""A raw Redis client for tests that knock on the store as an outsider would."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def outsider(**kwargs: Any) -> redis.Redis:
    """``redis.Redis(**kwargs)`` that tries once. redis-py retries a failed connection three
    times with backoff, an authentication refusal included (AuthenticationError is a
    ConnectionError): a test expecting the refusal would wait seconds for it."""
    return redis.Redis(retry=Retry(NoBackoff(), 0), socket_timeout=5, **kwargs)
