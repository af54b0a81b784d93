"""The runtime every Gödel service runs on: typed config, structured logging, the gRPC server
with health and reflection, and the start/stop lifecycle. See README.md."""

from services.runtime.config import ConfigError, ServiceConfig, load_config, option
from services.runtime.logging import configure_logging
from services.runtime.service import (
    Dial,
    Service,
    ServiceHost,
    StartupError,
    cancel_and_wait,
    main,
    run_service,
    serve,
)

__all__ = [
    "ConfigError",
    "Dial",
    "Service",
    "ServiceConfig",
    "ServiceHost",
    "StartupError",
    "cancel_and_wait",
    "configure_logging",
    "load_config",
    "main",
    "option",
    "run_service",
    "serve",
]
