"""Store: the async client every service uses (placeholder: filled in by the store work)."""

from __future__ import annotations

import redis.asyncio as aioredis


class Store:
    def __init__(self, redis: aioredis.Redis, cluster: str = "default") -> None:
        self._redis = redis
        self.cluster = cluster

    @classmethod
    async def connect(cls, url: str, *, cluster: str = "default") -> Store:
        redis = aioredis.Redis.from_url(url, decode_responses=False)
        store = cls(redis, cluster)
        await store.ping()
        return store

    async def ping(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()
