"""Typed service configuration.

Every service has a frozen dataclass deriving from :class:`ServiceConfig`. A value comes from, in
increasing precedence: the field's default, the YAML file given with ``--config``, the environment
(``GODEL_<FIELD>``, e.g. ``GODEL_STORE_URL``) and command-line flags (``--store-url``). Flags are
generated from the dataclass fields, so adding a field to a config class is all it takes to make it
configurable in every way.

Bad input never falls through to a default: an unknown key, a value of the wrong type or out of
range raises :class:`ConfigError` naming the key and where it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

from foundation import tls

ENV_PREFIX = "GODEL_"

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(Exception):
    """The configuration is invalid; the message names the key and its source."""


def default_instance_name() -> str:
    # Compose replicas get HOSTNAME = container id, so this is unique per replica and per process.
    return f"{socket.gethostname()}-{os.getpid()}"


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})
"""Bind hosts meaning "every interface": no peer can dial them, so they are never advertised."""


def advertised_address(
    advertise_address: str, host: str, port: int, hostname: str | None = None
) -> str:
    """The ``host:port`` a service publishes for its peers (SchedulerInstance, binder lease,
    Node.spec.agent_address): the configured ``advertise_address``, else the bind host with the
    bound port, else — when the bind host is a wildcard — this machine's hostname.

    The hostname, not the address it resolves to: in a compose project a container's default
    hostname (its short id) is a DNS name on the project network (Docker's embedded DNS answers it;
    a custom ``hostname:`` it does not), while what the name resolves to locally is Docker's
    /etc/hosts entry for the first network only, or on a bare Debian host 127.0.1.1, which no peer
    can reach. gRPC also re-resolves a name on every reconnect, so a container that restarts with
    a new address stays reachable under the address it published.
    """
    if advertise_address:
        return advertise_address
    if host in WILDCARD_HOSTS:
        host = hostname if hostname is not None else socket.gethostname()
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def default_home() -> Path:
    return Path.home() / ".godel"


def option(
    help: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    env_aliases: tuple[str, ...] = (),
    file_only: bool = False,
) -> dict[str, Any]:
    """Field metadata: help text, optional numeric bounds, extra environment variable names.
    ``file_only``: a structured setting (type ``object``, e.g. a list of policies) that only the
    ``--config`` file can give; it gets no flag and no environment variable, and the service
    validates its shape itself."""
    return {
        "help": help,
        "minimum": minimum,
        "maximum": maximum,
        "env_aliases": env_aliases,
        "file_only": file_only,
    }


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Settings every service shares. Subclass it (frozen) to add a service's own settings."""

    name: str = field(
        default_factory=default_instance_name,
        metadata=option("instance id, unique in the cluster (default: HOSTNAME-PID)"),
    )
    host: str = field(default="127.0.0.1", metadata=option("address the gRPC server binds to"))
    advertise_address: str = field(
        default="",
        metadata=option(
            "host:port others reach this service at (default: host:bound port; the hostname "
            "instead of a wildcard host such as 0.0.0.0)"
        ),
    )
    port: int = field(
        default=0,
        metadata=option("gRPC port; 0 picks a free one (it is logged)", minimum=0, maximum=65535),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=option("address the Prometheus metrics endpoint binds to (loopback by default)"),
    )
    metrics_port: int = field(
        default=0,
        metadata=option(
            "port of the Prometheus metrics endpoint (/metrics); 0 picks a free one (it is "
            "logged), -1 serves none",
            minimum=-1,
            maximum=65535,
        ),
    )
    metrics_sample_seconds: float = field(
        default=1.0,
        metadata=option(
            "how often gauges (queue depths, credits, leadership) are sampled", minimum=0.05
        ),
    )
    store_url: str = field(
        default="redis://127.0.0.1:6379/0",
        metadata=option(
            "URL of the Redis/Valkey store (also $GODEL_REDIS_URL)",
            env_aliases=("GODEL_REDIS_URL",),
        ),
    )
    store_password_file: str = field(
        default="",
        metadata=option(
            "file holding the store password, put into the store URL (for secrets mounted from "
            "a volume, as docker-compose.yml does; the URL then names only the user)"
        ),
    )
    cluster: str = field(
        default="default",
        metadata=option("cluster name: the store keeps each cluster's keys apart"),
    )
    store_connect_seconds: float = field(
        default=10.0,
        metadata=option("how long to keep retrying an unreachable store at startup", minimum=0),
    )
    log_level: LogLevel = field(default="info", metadata=option("lowest level logged"))
    log_format: LogFormat = field(
        default="auto",
        metadata=option("'json', 'console', or 'auto': console on a TTY, JSON otherwise"),
    )
    grace_seconds: float = field(
        default=5.0,
        metadata=option(
            "on SIGTERM, how long in-flight RPCs may run before being cancelled", minimum=0
        ),
    )
    home: Path = field(
        default_factory=default_home,
        metadata=option("local state directory (pod work dirs, logs); also $GODEL_HOME"),
    )
    tls_dir: str = field(
        default="",
        metadata=option(
            "directory of the cluster's CA and service certificate (default: HOME/tls)"
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=option("serve and dial without TLS: anyone who reaches the port may do anything"),
    )

    https_on_loopback: bool = field(
        default=False,
        metadata=option(
            "serve metrics and the dashboard over HTTPS with client certificates on loopback "
            "too (on any other address they always are, unless --insecure)"
        ),
    )

    def credentials_dir(self) -> Path:
        return Path(self.tls_dir) if self.tls_dir else self.home / "tls"

    def serves_https(self, host: str) -> bool:
        """Whether an HTTP endpoint bound to ``host`` (metrics, the dashboard) requires the
        cluster's credentials: when exposed beyond loopback, or asked for; never in insecure
        mode, which has no credentials to require."""
        if self.insecure:
            return False
        return self.https_on_loopback or not tls.is_loopback(host)

    def store_connection_url(self) -> str:
        """``store_url`` with the password from ``store_password_file``, if one is given."""
        if not self.store_password_file:
            return self.store_url
        path = Path(self.store_password_file).expanduser()
        try:
            password = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"store_password_file: cannot read {path}: {exc.strerror or exc}"
            ) from exc
        if not password:
            raise ConfigError(f"store_password_file: {path} is empty")
        return url_with_password(self.store_url, password)


def url_with_password(url: str, password: str) -> str:
    """``url`` carrying ``password`` (its user, if it names none, is the store's service user)."""
    parts = urlsplit(url)
    user = parts.username or "godel"
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


ConfigT = TypeVar("ConfigT", bound=ServiceConfig)


def load_config(
    config_cls: type[ConfigT],
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    prog: str | None = None,
) -> ConfigT:
    """Build ``config_cls`` from defaults < ``--config`` file < environment < flags."""
    environ = os.environ if environ is None else environ
    flags = vars(build_parser(config_cls, prog=prog).parse_args(list(argv)))
    config_file: Path | None = flags.pop("config", None)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    hints = typing.get_type_hints(config_cls)

    # Later sources overwrite earlier ones; each raw value remembers where it came from.
    raw: dict[str, tuple[object, str]] = {}
    if config_file is not None:
        for key, value in _read_config_file(config_file).items():
            if key not in fields:
                known = ", ".join(sorted(fields))
                raise ConfigError(f"{config_file}: unknown key {key!r} (known keys: {known})")
            raw[key] = (value, f"{config_file}: key {key!r}")
    for spec in fields.values():
        if spec.metadata.get("file_only"):
            continue
        for var in _env_names(spec):  # the canonical name first: it wins over its aliases
            if var in environ:
                raw[spec.name] = (environ[var], f"environment variable {var}")
                break
    for key, value in flags.items():
        raw[key] = (value, f"flag --{key.replace('_', '-')}")

    values: dict[str, Any] = {
        key: _coerce(value, hints[key], fields[key], source) for key, (value, source) in raw.items()
    }
    return config_cls(**values)


def build_parser(
    config_cls: type[ServiceConfig], *, prog: str | None = None
) -> argparse.ArgumentParser:
    """An argparse parser with ``--config`` and one flag per field of ``config_cls``.

    Flags are parsed as raw strings and omitted when absent, so :func:`load_config` can layer them
    over the file and the environment and report a bad value the same way for every source.
    """
    parser = _Parser(prog=prog, description=config_cls.__doc__, argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML file of settings")
    hints = typing.get_type_hints(config_cls)
    for spec in dataclasses.fields(config_cls):
        if spec.metadata.get("file_only"):
            continue
        hint = hints[spec.name]
        envs = " or ".join(f"${name}" for name in _env_names(spec))
        parser.add_argument(
            f"--{spec.name.replace('_', '-')}",
            dest=spec.name,
            metavar=spec.name.upper(),
            choices=typing.get_args(hint) if _is_literal(hint) else None,
            help=f"{spec.metadata.get('help', '')} [env {envs}]",
        )
    return parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def _env_names(spec: dataclasses.Field[Any]) -> tuple[str, ...]:
    aliases: tuple[str, ...] = spec.metadata.get("env_aliases", ())
    return (ENV_PREFIX + spec.name.upper(), *aliases)


def _read_config_file(path: Path) -> dict[str, object]:
    import yaml  # a --config file's reader's only: ~1 MiB of heap a service without one never needs

    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if document is None:
        return {}
    if not isinstance(document, dict) or not all(isinstance(k, str) for k in document):
        raise ConfigError(f"{path}: expected a mapping of setting names to values")
    return document


def _is_literal(hint: object) -> bool:
    return typing.get_origin(hint) is Literal


def _coerce(value: object, hint: object, spec: dataclasses.Field[Any], source: str) -> object:
    """Convert a raw value (string from env/flags, YAML scalar from a file) to the field's type."""
    converted = _convert(value, hint)
    if converted is None:
        raise ConfigError(f"{source}: {value!r} is not {_describe(hint)}")
    if isinstance(converted, int | float):
        minimum, maximum = spec.metadata.get("minimum"), spec.metadata.get("maximum")
        if minimum is not None and converted < minimum:
            raise ConfigError(f"{source}: {value!r} is below the minimum {minimum}")
        if maximum is not None and converted > maximum:
            raise ConfigError(f"{source}: {value!r} is above the maximum {maximum}")
    return converted


def _convert(value: object, hint: object) -> object | None:
    """The converted value, or None when ``value`` does not fit ``hint``."""
    if _is_literal(hint):
        return value if value in typing.get_args(hint) else None
    if hint is object:  # a file-only structured setting: its service checks the shape
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        return True if text in _TRUE else False if text in _FALSE else None
    if isinstance(value, bool):  # YAML booleans are ints to Python; never accept them as numbers
        return None
    if hint is int:
        if isinstance(value, int):
            return value
        return _parse(int, value) if isinstance(value, str) else None
    if hint is float:
        if isinstance(value, int | float):
            return float(value)
        return _parse(float, value) if isinstance(value, str) else None
    if hint is str:
        return value if isinstance(value, str) else None
    if hint is Path:
        return Path(value).expanduser() if isinstance(value, str) and value else None
    raise TypeError(f"unsupported config field type {hint!r}")


def _parse(kind: type[int] | type[float], text: str) -> int | float | None:
    try:
        return kind(text.strip())
    except ValueError:
        return None


def _describe(hint: object) -> str:
    if _is_literal(hint):
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        Path: "a path",
    }
    return names.get(hint, str(hint)) if isinstance(hint, type) else str(hint)
