"""The store client's connection: connecting to a server or, through Sentinel, to a replicated
store's primary; the error translation and read retry every round trip goes through; and the
wait for replicas that ends a replicated write."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any, Self, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import redis.asyncio as aioredis
import structlog
from redis import exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from store.errors import ReplicationError, StoreError, StoreUnavailableError
from store.keys import Keys
from store.kinds import DEFAULT_MAX_OBJECT_BYTES
from store.metrics import READ_ROUND_TRIP
from store.packing import pack_with_hiredis

log = structlog.get_logger(__name__)

T = TypeVar("T")

DEFAULT_FEED_MAX_LEN = 500_000

SENTINEL_SCHEME = "redis+sentinel"


def redact_url(url: str) -> str:
    """The store URL with its password, if any, replaced by ``***`` (for logs and tables)."""
    parts = urlsplit(url)
    credentials, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))


@dataclass(frozen=True)
class SentinelTarget:
    """A replicated store found through Sentinel, as a URL names it:
    ``redis+sentinel://[user:password@]host:port[,host:port...]/service[?replicas=N&replica_timeout_ms=T]``.
    The password is the services' on the servers and on the Sentinels alike. ``replicas``: how
    many replicas must have a write before the store acknowledges it (``WAIT``; default 1);
    ``replica_timeout_ms``: how long a write waits for them before it fails."""

    sentinels: list[tuple[str, int]]
    service: str
    username: str | None
    password: str | None
    replicas: int = 1
    replica_timeout_ms: int = 2000

    @classmethod
    def parse(cls, url: str) -> SentinelTarget:
        parts = urlsplit(url)
        if parts.scheme != SENTINEL_SCHEME:
            raise ValueError(f"not a {SENTINEL_SCHEME}:// URL: {redact_url(url)}")
        credentials, at, hosts = parts.netloc.rpartition("@")
        username, _, password = credentials.partition(":") if at else ("", "", "")
        sentinels: list[tuple[str, int]] = []
        for address in hosts.split(","):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{redact_url(url)}: {address!r} is not host:port")
            sentinels.append((host, int(port)))
        service = parts.path.strip("/")
        if not service:
            raise ValueError(f"{redact_url(url)}: no service name (the path) given")
        query = parse_qs(parts.query)
        try:
            replicas = int(query.get("replicas", ["1"])[0])
            timeout = int(query.get("replica_timeout_ms", ["2000"])[0])
        except ValueError as exc:
            raise ValueError(f"{redact_url(url)}: {exc}") from exc
        return cls(
            sentinels=sentinels,
            service=service,
            username=unquote(username) or None,
            password=unquote(password) or None,
            replicas=replicas,
            replica_timeout_ms=timeout,
        )


def _feed_entries(response: Any, **_: Any) -> list[Any]:
    """An XREAD reply of one stream as its list of [id, [field, value, ...]] entries (empty
    when the read timed out); RESP3 replies are a map by stream, RESP2 ones a list of pairs."""
    if not response:
        return []
    entries: list[Any] = (
        next(iter(response.values())) if isinstance(response, dict) else response[0][1]
    )
    return entries


CONNECTION_ERRORS = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


def is_busy(exc: redis_errors.ResponseError) -> bool:
    # The server is running a script past its busy threshold and refuses every other command
    # unexecuted (e.g. one atomic commit of a 100,000-pod job): unavailable for now, not an
    # error of the request.
    # (A pipeline wraps the reply: "Command # 1 (...) of pipeline caused error: ('BUSY ...',)".)
    return str(exc).startswith("BUSY") or "('BUSY " in str(exc)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    try:
        yield
    except CONNECTION_ERRORS as exc:
        raise StoreUnavailableError(f"store unreachable: {exc}") from exc
    except redis_errors.ResponseError as exc:
        if is_busy(exc):
            raise StoreUnavailableError(f"store busy: {exc}") from exc
        raise


async def read_with_retry(call: Callable[[], Awaitable[T]]) -> T:
    """Run an idempotent read. After a server restart every pooled connection is stale and
    fails once, so a read gets one retry on a fresh connection; writes never retry (their
    outcome would be ambiguous)."""
    try:
        with READ_ROUND_TRIP.time():
            return await call()
    except CONNECTION_ERRORS:
        pass
    except redis_errors.ResponseError as exc:
        if not is_busy(exc):
            raise
    with translate_errors(), READ_ROUND_TRIP.time():
        return await call()


_LUA = {
    name: (resources.files("store") / "lua" / f"{name}.lua").read_text()
    for name in ("commit", "lease", "heartbeat", "snapshot")
}


class StoreConnection:
    """The connection every part of ``Store`` shares: the Redis client, the cluster's keys,
    the registered scripts and the replication settings; connecting, and waiting for replicas."""

    def __init__(
        self,
        redis: aioredis.Redis,
        cluster: str = "default",
        *,
        feed_max_len: int = DEFAULT_FEED_MAX_LEN,
        max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
        replicas: int = 0,
        replica_timeout_ms: int = 2000,
    ) -> None:
        self._redis = redis
        self.cluster = cluster
        # Writes are acknowledged only once this many replicas have them (WAIT).
        self.replicas = replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.keys = Keys(cluster)
        self.feed_max_len = feed_max_len
        self.max_object_bytes = max_object_bytes
        # The watch parses the change feed's entries itself (redis-py would build a dict per
        # entry, a fifth of a watcher's time), so XREAD replies come back as they arrived.
        redis.set_response_callback("XREAD", _feed_entries)
        self._commit_script = redis.register_script(_LUA["commit"])
        self._lease_script = redis.register_script(_LUA["lease"])
        self._heartbeat_script = redis.register_script(_LUA["heartbeat"])
        self._snapshot_script = redis.register_script(_LUA["snapshot"])

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        cluster: str = "default",
        feed_max_len: int = DEFAULT_FEED_MAX_LEN,
        max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
        max_connections: int = 64,
    ) -> Self:
        """Connect to a ``redis://`` URL, or to the primary of a replicated store that Sentinel
        watches (``redis+sentinel://``, see SentinelTarget): every new connection then asks the
        Sentinels where the primary is, so after a failover the store follows the new one."""
        # No automatic retries: a commit whose reply was lost may have been applied, and only the
        # caller knows whether repeating it is safe.
        replicas, replica_timeout_ms = 0, 2000
        if url.startswith(f"{SENTINEL_SCHEME}://"):
            try:
                target = SentinelTarget.parse(url)
            except ValueError as exc:
                raise StoreError(str(exc)) from None
            sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves Sentinel.__init__ unannotated
                target.sentinels,
                sentinel_kwargs={
                    "password": target.password,
                    "socket_timeout": 2,
                    "socket_connect_timeout": 2,
                },
            )
            redis: aioredis.Redis = sentinel.master_for(
                target.service,
                username=target.username,
                password=target.password,
                decode_responses=False,
                retry=Retry(NoBackoff(), 0),
                max_connections=max_connections,
                socket_connect_timeout=5,
            )
            replicas, replica_timeout_ms = target.replicas, target.replica_timeout_ms
        else:
            redis = aioredis.Redis.from_url(
                url,
                decode_responses=False,
                retry=Retry(NoBackoff(), 0),
                max_connections=max_connections,
                socket_connect_timeout=5,
            )
        store = cls(
            pack_with_hiredis(redis),
            cluster,
            feed_max_len=feed_max_len,
            max_object_bytes=max_object_bytes,
            replicas=replicas,
            replica_timeout_ms=replica_timeout_ms,
        )
        await store.ping()
        return store

    async def ping(self) -> None:
        await read_with_retry(self._redis.ping)

    async def close(self) -> None:
        await self._redis.aclose()

    async def server_info(self) -> dict[str, Any]:
        """The server's INFO ``server`` section (name, version, role, ...)."""
        info: dict[str, Any] = await read_with_retry(lambda: self._redis.info("server"))
        return info

    def _wait_for_replicas(self, pipe: Any) -> None:
        """End a pipeline of writes with WAIT: on the same connection, after them, so its count
        is of replicas that have every one of them."""
        if self.replicas:
            pipe.execute_command("WAIT", self.replicas, self.replica_timeout_ms)

    def _check_replicated(self, replies: list[Any]) -> None:
        if not self.replicas:
            return
        acknowledged = replies[-1]
        if isinstance(acknowledged, BaseException) or int(acknowledged) < self.replicas:
            raise ReplicationError(self.replicas, self.replica_timeout_ms, acknowledged)
