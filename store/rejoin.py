"""How a server of a replicated store starts: in the role its Sentinels give it.

    python -P -m store.rejoin --data-dir DIR [--host NAME] --port PORT -- valkey-server ARGS...

Every start of a server of a ``ReplicatedStore`` goes through this (it is the command `godel up`
records, so an operator or a supervisor that starts a dead server again runs it too), and so does
every start of a store server of docker-compose.yml (its `ha` profile's primary and replica,
``--host`` their service name, the name they announce). It asks the Sentinels named in
``DIR/sentinels`` (``host:port`` a line; every address a name resolves to, as a scaled compose
service has several) which server is the primary, then replaces itself (exec, same pid) with the
server:

- another server is the primary → the server starts as its replica (``--replicaof``, replacing
  any the command gives);
- this server is, and the Sentinels have lost it (its link is down, or they deem it down, or a
  failover is under way) → it waits for their verdict, polling every 0.1 s: once they promote
  another server it starts as that one's replica; if none is promoted within a failover's time
  (``down-after-milliseconds`` + 3 × ``failover-timeout``: no replica to promote, no quorum) it
  starts as the primary they still name;
- this server is, and they have not lost it → as the primary (without any ``--replicaof`` of the
  command: compose's replica was started as one, and may since have been promoted);
- no Sentinel answers (the store's first start: they start after the servers; a compose project
  without the `ha` profile) → as configured.

Why: a primary killed and started again at once comes back *as a primary*, from its config
file, while the Sentinels fail over from it (they notice its death within
``down-after-milliseconds`` and do not abort a failover once begun). Sentinel then turns the
returned server into a replica of the new primary only after a fixed wait built into it (eight
seconds after the server first reports its role, checked on the next INFO, sent every ten
seconds), and with one replica no write can be acknowledged (``WAIT``) until then: 18–19 s
without writes. Started as a replica from the outset, it syncs at once and writes resume as soon
as the promotion is done. Waiting while the Sentinels decide, rather than starting as the
primary in their midst, also means no client can write to a primary that is about to be demoted.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from store.server import (
    HOST,
    SENTINEL_SERVICE,
    SENTINELS_FILE,
    STORE_SERVER_USER,
    read_admin_secret,
)

POLL_SECONDS = 0.1
_ASK_TIMEOUT_SECONDS = 0.5
# The Sentinels' flags that say they have lost the primary they name.
LOST_FLAGS = frozenset({"disconnected", "s_down", "o_down", "failover_in_progress"})


@dataclass(frozen=True)
class PrimaryView:
    """One Sentinel's answer to ``SENTINEL MASTER``: the primary it names and what it thinks
    of it."""

    host: str
    port: int
    config_epoch: int
    flags: frozenset[str]
    down_after_ms: int
    failover_timeout_ms: int

    @classmethod
    def parse(cls, reply: dict[str, Any]) -> PrimaryView:
        """From redis-py's parsed reply (numbers as int)."""
        return cls(
            host=str(reply["ip"]),
            port=int(reply["port"]),
            config_epoch=int(reply["config-epoch"]),
            flags=frozenset(str(reply["flags"]).split(",")),
            down_after_ms=int(reply["down-after-milliseconds"]),
            failover_timeout_ms=int(reply["failover-timeout"]),
        )

    @property
    def failover_bound_seconds(self) -> float:
        """How long a failover may take: noticing the death, an attempt that fails (a split
        vote: ``failover-timeout``) and the retry, which waits twice as long again."""
        return (self.down_after_ms + 3 * self.failover_timeout_ms) / 1000


@dataclass(frozen=True)
class Role:
    """How to start: as a replica of ``replica_of``; or (None) as the primary when ``primary``;
    else as the command and the config file say."""

    replica_of: tuple[str, int] | None
    reason: str
    primary: bool = False

    def server_command(self, command: Sequence[str]) -> list[str]:
        """The server's command for this role: a ``--replicaof HOST PORT`` the command gives is
        dropped unless the role is "as configured", and the role's own appended."""
        if self.replica_of is None and not self.primary:
            return list(command)
        kept: list[str] = []
        skip = 0
        for arg in command:
            if skip:
                skip -= 1
            elif arg in ("--replicaof", "--slaveof"):
                skip = 2
            else:
                kept.append(arg)
        if self.replica_of is None:
            return kept
        host, port = self.replica_of
        return [*kept, "--replicaof", host, str(port)]


def choose(views: Sequence[PrimaryView], me: tuple[str, int]) -> Role | None:
    """The role to start in, given the Sentinels' answers; None: wait for their verdict."""
    if not views:
        return Role(None, "no Sentinel answers: starting as configured")
    # Sentinels that disagree converge on the configuration with the highest epoch.
    newest = max(views, key=lambda v: v.config_epoch)
    primary = (newest.host, newest.port)
    if primary != me:
        return Role(primary, f"the Sentinels name {newest.host}:{newest.port} the primary")
    if any(view.flags & LOST_FLAGS for view in views):
        return None
    return Role(None, "the Sentinels name this server the primary", primary=True)


def ask(sentinels: Sequence[tuple[str, int]], admin_password: str | None) -> list[PrimaryView]:
    """What every Sentinel that answers says of the primary (silent ones are left out)."""
    views: list[PrimaryView] = []
    for host, port in resolve(sentinels):
        client = redis.Redis(
            host=host,
            port=port,
            username=STORE_SERVER_USER,
            password=admin_password,
            socket_timeout=_ASK_TIMEOUT_SECONDS,
            socket_connect_timeout=_ASK_TIMEOUT_SECONDS,
            retry=RedisRetry(NoBackoff(), 0),
        )
        try:
            reply = client.sentinel_master(SENTINEL_SERVICE, return_responses=True)
            if isinstance(reply, dict):
                views.append(PrimaryView.parse(reply))
        except (redis.RedisError, KeyError, ValueError):
            continue
        finally:
            client.close()
    return views


def resolve(sentinels: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Each Sentinel's every address: a name may stand for several (Docker's DNS answers a scaled
    service's name with each replica's address). A name that does not resolve is left out."""
    addresses: list[tuple[str, int]] = []
    for host, port in sentinels:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            continue
        for info in infos:
            address = (str(info[4][0]), port)
            if address not in addresses:
                addresses.append(address)
    return addresses


def await_role(
    sentinels: Sequence[tuple[str, int]], admin_password: str | None, me: tuple[str, int]
) -> Role:
    """Ask until the Sentinels give a role; after a failover's time of waiting, the primary."""
    started = time.monotonic()
    while True:
        views = ask(sentinels, admin_password)
        role = choose(views, me)
        if role is not None:
            return role
        bound = max(view.failover_bound_seconds for view in views)
        if time.monotonic() - started >= bound:
            return Role(None, f"no failover within {bound:g}s: starting as the primary", True)
        time.sleep(POLL_SECONDS)


def read_sentinels(data_dir: Path) -> list[tuple[str, int]]:
    """The Sentinels a server's data dir names (``host:port`` a line; none without the file)."""
    try:
        lines = (data_dir / SENTINELS_FILE).read_text().split()
    except FileNotFoundError:
        return []
    addresses: list[tuple[str, int]] = []
    for line in lines:
        host, _, port = line.rpartition(":")
        addresses.append((host, int(port)))
    return addresses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m store.rejoin", description=__doc__)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument(
        "--host", default=HOST, help="this server's address as the Sentinels name it"
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the server's command is missing (after --)")
    role = await_role(
        read_sentinels(args.data_dir), read_admin_secret(args.data_dir), (args.host, args.port)
    )
    # The server's log (where this goes, before the server's own --logfile takes over) says why.
    sys.stdout.write(f"store.rejoin: {role.reason}\n")
    sys.stdout.flush()
    server = role.server_command(command)
    # execvp: compose names the server by its name on $PATH; `godel up`, by its path.
    os.execvp(server[0], server)


if __name__ == "__main__":
    raise SystemExit(main())
