"""Object writes: create/update/delete, ``commit`` (atomic ops, optionally fenced), ``commit_many``
and its batch forms (many independent commits pipelined in one round trip), and the replication
barrier a retried write needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message
from redis import exceptions as redis_errors

from protos.godel.v1 import objects_pb2 as pb
from store import kinds as kinds_mod
from store.connection import StoreConnection, is_busy, translate_errors
from store.errors import CommitError, StoreError, StoreUnavailableError
from store.kinds import StoredObject
from store.lease import Fence
from store.metrics import COMMIT_ROUND_TRIP
from store.ops import MAX_OPS_PER_CALL, Bind, Create, Delete, Op, ScriptCall, Update

# A stored kind's message: writes return the objects they were given, typed as given.
M = TypeVar("M", bound=StoredObject)


class ObjectWrites(StoreConnection):
    """Writes, every one through ``lua/commit.lua``: single objects, atomic commits of many ops
    (optionally fenced), and many independent commits in one round trip."""

    async def create(self, obj: M) -> M:
        """Store a new object; sets its uid, creation time and resource_version in place."""
        await self._commit_one(Create(obj))
        return obj

    async def update(self, obj: M, *, force: bool = False) -> M:
        """Compare-and-set: succeeds only if the stored version equals
        ``obj.metadata.resource_version`` (any version with ``force``). Updates it in place."""
        await self._commit_one(Update(obj, force))
        return obj

    async def delete(self, cls: type[Message], name: str, *, expected_version: int = 0) -> int:
        """Delete an object (only at ``expected_version`` if non-zero); returns the revision of
        the deletion. Deleting a bound pod returns its claim on its node."""
        return await self._commit_one(
            Delete(kinds_mod.kind_for_class(cls).name, name, expected_version)
        )

    async def create_raw(self, kind_name: str, data: bytes) -> StoredObject:
        """Store an object given as untrusted bytes (e.g. from the wire), strictly checked."""
        kind = kinds_mod.kind_named(kind_name)
        obj = kinds_mod.decode_untrusted(kind, data)
        return await self.create(obj)

    async def commit(self, ops: Sequence[Op], *, fence: Fence | None = None) -> list[int]:
        """Apply every op or none. Returns each op's revision (and sets it on the objects).
        Raises CommitError naming the failing op, or FencedError if ``fence`` is stale."""
        result = (await self.commit_many([ops], fence=fence))[0]
        if isinstance(result, StoreError):
            raise result
        return result

    async def commit_many(
        self, commits: Sequence[Sequence[Op]], *, fence: Fence | None = None
    ) -> list[list[int] | StoreError]:
        """Many independent atomic commits in one round trip. Each result is that commit's
        revisions or its error; a failure of one does not affect the others. Commits travel
        many to a script call (at most ``MAX_OPS_PER_CALL`` ops each, so no call holds the
        server for long) and the calls are pipelined."""
        calls: list[ScriptCall] = []
        placed: list[tuple[ScriptCall, int] | StoreError] = []
        for ops in commits:
            if not calls or calls[-1].op_count >= MAX_OPS_PER_CALL:
                calls.append(ScriptCall(self.keys, fence, self.feed_max_len))
            try:
                placed.append((calls[-1], calls[-1].add(ops, self.max_object_bytes)))
            except StoreError as exc:
                placed.append(exc)
        calls = [c for c in calls if c.commits]
        replies: dict[int, list[Any] | BaseException] = {}
        if len(calls) == 1 and not self.replicas:
            with translate_errors(), COMMIT_ROUND_TRIP.time():
                replies[id(calls[0])] = await self._commit_script(
                    keys=calls[0].keys, args=calls[0].args
                )
        elif calls:
            with translate_errors(), COMMIT_ROUND_TRIP.time():
                async with self._redis.pipeline(transaction=False) as pipe:
                    for call in calls:
                        await self._commit_script(keys=call.keys, args=call.args, client=pipe)
                    self._wait_for_replicas(pipe)
                    executed = await pipe.execute(raise_on_error=False)
                    self._check_replicated(executed)
                    for call, reply in zip(calls, executed[: len(calls)], strict=True):
                        replies[id(call)] = reply
        results: list[list[int] | StoreError] = []
        for entry in placed:
            if isinstance(entry, StoreError):
                results.append(entry)
                continue
            call, index = entry
            reply = replies[id(call)]
            if isinstance(reply, BaseException):
                busy = isinstance(reply, redis_errors.ResponseError) and is_busy(reply)
                error = StoreUnavailableError if busy else StoreError
                results.append(error(f"commit failed: {reply}"))
                continue
            try:
                results.append(call.finish(index, reply[index], fence))
            except StoreError as exc:
                results.append(exc)
        return results

    async def replication_barrier(self) -> None:
        """Return once the replicas have every write the primary acknowledged so far, or raise
        ReplicationError. For a caller that found its earlier, unacknowledged write already
        there (a retry) and is about to report it done: that write may not be replicated yet.
        (A replica that has this later write has all earlier ones: replication is in order.)"""
        if not self.replicas:
            return
        with translate_errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.incr(self.keys.replication_barrier)
                self._wait_for_replicas(pipe)
                replies = await pipe.execute()
        self._check_replicated(replies)

    async def create_many(self, objs: Sequence[M]) -> list[M | StoreError]:
        """Pipelined creates, each on its own (not atomic together)."""
        return self._per_object(objs, await self.commit_many([[Create(o)] for o in objs]))

    async def update_many(self, objs: Sequence[M], *, force: bool = False) -> list[M | StoreError]:
        """Pipelined compare-and-set updates, each on its own (not atomic together)."""
        return self._per_object(objs, await self.commit_many([[Update(o, force)] for o in objs]))

    async def create_unit(self, job: pb.Job, pods: Sequence[pb.Pod]) -> list[int]:
        """Create a job and all its pods atomically: all of them or none."""
        return await self.commit([Create(job), *(Create(p) for p in pods)])

    async def bind(self, pods: Sequence[pb.Pod], *, fence: Fence) -> list[int]:
        """Bind a batch of pods (``spec.node_name`` set) and account them on their nodes, in one
        fenced transaction: every pod or none."""
        return await self.commit([Bind(p) for p in pods], fence=fence)

    @staticmethod
    def _per_object(
        objs: Sequence[M], results: list[list[int] | StoreError]
    ) -> list[M | StoreError]:
        """One-op commits: report the operation's own error, not the commit wrapper."""
        out: list[M | StoreError] = []
        for obj, r in zip(objs, results, strict=True):
            if isinstance(r, CommitError):
                out.append(r.cause)
            elif isinstance(r, StoreError):
                out.append(r)
            else:
                out.append(obj)
        return out

    async def _commit_one(self, op: Op) -> int:
        try:
            return (await self.commit([op]))[0]
        except CommitError as exc:
            raise exc.cause from None
