"""The operations of an atomic commit (``Create``, ``Update``, ``Delete``, ``Bind``, ``Release``)
and ``ScriptCall``, the arguments of one ``lua/commit.lua`` call carrying one or more commits
and the reading of its replies into revisions or typed errors."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from placement.nodeinfo import pool_of
from placement.resources import MILLI_PER_CARD, request_milli
from protos.godel.v1 import objects_pb2 as pb
from store import kinds as kinds_mod
from store.errors import (
    AlreadyBoundError,
    AlreadyExistsError,
    CommitError,
    ConflictError,
    FencedError,
    InsufficientCapacityError,
    InvalidObjectError,
    NotFoundError,
    StoreError,
)
from store.keys import Keys
from store.kinds import Kind, StoredObject
from store.lease import Fence

# Bounds the time one script call holds the (single-threaded) server.
MAX_OPS_PER_CALL = 1000


@dataclass(frozen=True, slots=True)
class Create:
    obj: Message  # a stored kind's message (checked when the commit is built)


@dataclass(frozen=True, slots=True)
class Update:
    """Compare-and-set on ``obj.metadata.resource_version`` unless ``force``. ``hint``: what
    the change is, in the writer's words, written beside it in the change feed (see
    ``FEED_HINTS``); only on a compare-and-set, so that it describes the change from the
    version read."""

    obj: Message  # a stored kind's message (checked when the commit is built)
    force: bool = False
    hint: str = ""


@dataclass(frozen=True, slots=True)
class Delete:
    kind: str
    name: str
    # 0: delete whatever version is there.
    expected_version: int = 0


@dataclass(frozen=True, slots=True)
class Bind:
    """Write ``pod`` (with ``spec.node_name`` set; CAS on its version) and claim its requests on
    that node's pool. Rejected if the pod is already bound or the pool would be over-committed."""

    pod: pb.Pod


@dataclass(frozen=True, slots=True)
class Release:
    """Write ``pod`` (CAS; e.g. now Succeeded) and return its claim on its node, if any."""

    pod: pb.Pod


Op = Create | Update | Delete | Bind | Release


# Feed hints: an update's writer may say what the change was (``Update.hint``); the feed entry
# carries it (field ``h``) and a reader that makes nothing of such a change passes over it
# without decoding the object (``ChangeFeed.watch``'s ``hinted``, ``Informer(hinted=)``). The
# store checks the form (a letter, then letters or digits) and that the write is a
# compare-and-set, not the meaning: that is the writer's word.
#
# ``R<started_ms>`` — a pod started: from ``POD_BOUND`` to ``POD_RUNNING`` with
# ``status.started_ms`` (the number) set, and nothing else changed. Its node, its claim, its
# spec, labels and deletion mark are those of the version before (the node agent's write).
POD_STARTED = b"R"
_HINT_FORM = re.compile(r"[A-Za-z][A-Za-z0-9]{0,31}")


def pod_started_hint(started_ms: int) -> str:
    """The hint of a pod's start at ``started_ms`` (``POD_STARTED``)."""
    return f"R{started_ms}"


def hinted_start(hint: bytes) -> int | None:
    """The start time a ``POD_STARTED`` hint carries; None for another hint."""
    if hint[:1] != POD_STARTED or not hint[1:].isdigit():
        return None
    return int(hint[1:])


# Uids name objects; they guard nothing, so they need uniqueness, not unpredictability: a
# generator seeded from the OS once per process, rather than a system call per uid (uuid4()
# was a third of building a commit of one-pod jobs).
_UIDS = random.Random(os.urandom(32))


def new_uid() -> str:
    """A fresh object uid: 128 random bits in hex, the form of ``uuid4().hex``."""
    return f"{_UIDS.getrandbits(128):032x}"


def _now_ms() -> int:
    return int(time.time() * 1000)


# GPUs are accounted in milli-GPU (placement.gpu): a share of a card claims its milli, so shares
# of one card fit as the placement library judges them.
def _capacity_spec(node: pb.Node) -> str:
    g, be = node.status.allocatable, node.status.reclaimable
    return (
        f"N {g.milli_cpu} {g.memory_bytes} {g.gpus * MILLI_PER_CARD} "
        f"{be.milli_cpu} {be.memory_bytes} {be.gpus * MILLI_PER_CARD} {g.pods}"
    )


def _claim_spec(pod: pb.Pod) -> str:
    tpl = pod.spec.template
    req = tpl.requests
    pool = pool_of(pod.spec.qos)
    gpus = request_milli(req.gpus, tpl.gpu_milli)
    return f"B {pod.spec.node_name} {pool} {req.milli_cpu} {req.memory_bytes} {gpus}"


class ScriptCall:
    """The KEYS and ARGV of one commit.lua call holding one or more commits."""

    def __init__(self, keys: Keys, fence: Fence | None, feed_max_len: int) -> None:
        self._keys = keys
        self.keys = [
            keys.revision,
            keys.feed,
            keys.lease(fence.lease) if fence else keys.no_lease,
            keys.accounting,
            keys.claims,
        ]
        self.args: list[Any] = [str(fence.epoch) if fence else "", feed_max_len, 0]
        self.op_count = 0
        self._slots: dict[str, int] = {}
        # Per commit, per op: (kind, name, expected version) and the object to stamp with its
        # new revision.
        self.commits: list[tuple[list[tuple[str, str, int]], list[StoredObject | None]]] = []

    def _slot(self, kind: Kind) -> int:
        slot = self._slots.get(kind.name)
        if slot is None:
            slot = self._slots[kind.name] = len(self._slots) + 1
            self.keys += [self._keys.data(kind.name), self._keys.versions(kind.name)]
        return slot

    def add(self, ops: Sequence[Op], max_object_bytes: int) -> int:
        """Append one commit; returns its index in this call. Raises before appending anything
        if an op is invalid."""
        if not ops:
            raise InvalidObjectError("a commit needs at least one operation")
        args: list[Any] = [len(ops)]
        described: list[tuple[str, str, int]] = []
        targets: list[StoredObject | None] = []
        now = _now_ms()
        for op in ops:
            if isinstance(op, Delete):
                kind = kinds_mod.kind_named(op.kind)
                acct = "X" if kind.name == "Node" else "R" if kind.name == "Pod" else ""
                expect = str(op.expected_version) if op.expected_version else "-"
                args += [f"D {self._slot(kind)} {kind.name} {op.name} {expect} {acct}", b""]
                described.append((kind.name, op.name, op.expected_version))
                targets.append(None)
                continue
            obj = op.pod if isinstance(op, Bind | Release) else op.obj
            if not kinds_mod.is_stored(obj):
                raise kinds_mod.not_stored(obj)
            if isinstance(op, Bind) and not op.pod.spec.node_name:
                raise InvalidObjectError("is required to bind", "spec.node_name")
            kind = kinds_mod.kind_of(obj)
            meta = obj.metadata
            if isinstance(op, Create):
                if not meta.uid:
                    meta.uid = new_uid()
                if not meta.creation_timestamp_ms:
                    meta.creation_timestamp_ms = now
                type_, expect = "C", "-"
            else:
                forced = isinstance(op, Update) and op.force
                if not forced and meta.resource_version <= 0:
                    raise InvalidObjectError(
                        "is required for a compare-and-set write (or use force)",
                        "metadata.resource_version",
                    )
                type_, expect = "U", "-" if forced else str(meta.resource_version)
                hint = op.hint if isinstance(op, Update) else ""
                if hint:
                    if forced or not _HINT_FORM.fullmatch(hint):
                        raise InvalidObjectError(
                            f"feed hint {hint[:40]!r}: a letter then letters or digits, "
                            "on a compare-and-set update only"
                        )
                    type_ += hint  # the op's type and its hint, one word (commit.lua)
            if isinstance(op, Bind):
                acct = _claim_spec(op.pod)
            elif isinstance(op, Release):
                acct = "R"
            elif type(obj) is pb.Node:  # not isinstance: ~0.2 µs when it is not (kinds.is_stored)
                acct = _capacity_spec(obj)
            else:
                acct = ""
            data = kinds_mod.encode(obj, kind, max_object_bytes)
            args += [f"{type_} {self._slot(kind)} {kind.name} {meta.name} {expect} {acct}", data]
            described.append((kind.name, meta.name, 0 if expect == "-" else int(expect)))
            targets.append(obj)
        self.args += args
        self.args[2] += 1
        self.op_count += len(ops)
        self.commits.append((described, targets))
        return len(self.commits) - 1

    def finish(self, index: int, reply: list[Any], fence: Fence | None) -> list[int]:
        """Turn one commit's script result into its revisions, or raise its typed error."""
        described, targets = self.commits[index]
        if int(reply[0]) == 1:
            first = int(reply[1])
            revisions = list(range(first, first + len(targets)))
            for obj, rev in zip(targets, revisions, strict=True):
                if obj is not None:
                    obj.metadata.resource_version = rev
            return revisions
        op_index, code = int(reply[1]), reply[2].decode()
        detail = [x.decode() if isinstance(x, bytes) else str(x) for x in reply[3:]]
        if code == "FENCED":
            assert fence is not None
            raise FencedError(fence.lease, fence.epoch, int(detail[0]))
        kind, name, expected = described[op_index - 1]
        cause: StoreError
        if code == "EXISTS":
            cause = AlreadyExistsError(kind, name)
        elif code == "NOTFOUND":
            cause = NotFoundError(kind, name)
        elif code == "CONFLICT":
            cause = ConflictError(kind, name, expected, int(detail[0]))
        elif code == "DUPLICATE":
            cause = InvalidObjectError(f"{kind} {name!r} appears twice in one commit")
        elif code == "BOUND":
            cause = AlreadyBoundError(name, detail[0])
        elif code == "NONODE":
            cause = NotFoundError("Node", detail[0])
        elif code == "INSUFFICIENT":
            node, pool, res, used, want, cap = detail
            cause = InsufficientCapacityError(
                node, pool, res, f" (used {used} + requested {want} > capacity {cap})"
            )
        else:
            cause = StoreError(f"commit failed: {code} {detail}")
        raise CommitError(op_index - 1, cause)
