"""Deprecated: the worker SDK moved to ``scheduler_gateway.worker``; this alias goes away in a later release."""

import warnings

from scheduler_gateway.wire.redact import redact_url as redact_url
from scheduler_gateway.worker import *  # noqa: F403
from scheduler_gateway.worker import __all__ as __all__

warnings.warn(
    "scheduler_gateway.daemon.worker is deprecated; import scheduler_gateway.worker", DeprecationWarning, stacklevel=2
)
