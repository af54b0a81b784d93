"""The Binder's settings (``python -m services.binder --help``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.runtime import ServiceConfig
from services.runtime.config import ConfigError, option


@dataclass(frozen=True)
class BinderConfig(ServiceConfig):
    """Binder settings."""

    lease_ms: int = field(
        default=3000,
        metadata=option("leader lease duration; a dead leader is replaced after this", minimum=100),
    )
    renew_ms: int = field(
        default=500,
        metadata=option("how often the leader renews (at most half of lease_ms)", minimum=10),
    )
    queue_depth: int = field(
        default=256,
        metadata=option("decision batches queued for the committer before streams wait", minimum=1),
    )
    max_batch_pods: int = field(
        default=20000,
        metadata=option("placements accepted in one DecisionBatch", minimum=1),
    )
    commit_retries: int = field(
        default=16,
        metadata=option("commit attempts per batch after the store rejects one pod", minimum=0),
    )
    sync_timeout_seconds: float = field(
        default=30.0,
        metadata=option("how long to wait for the informer to list or catch up", minimum=0.1),
    )

    def __post_init__(self) -> None:
        if self.renew_ms * 2 > self.lease_ms:
            raise ConfigError(
                f"renew_ms ({self.renew_ms}) must be at most half of lease_ms ({self.lease_ms})"
            )
