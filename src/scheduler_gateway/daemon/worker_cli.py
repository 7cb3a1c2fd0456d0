"""Deprecated: ``gateway-worker`` is ``scheduler_gateway.worker._cli:worker_main`` now. Kept so a console script
installed before the move (its entry point names this module) keeps working until it is reinstalled."""

from scheduler_gateway.worker._cli import worker_main

__all__ = ["worker_main"]
