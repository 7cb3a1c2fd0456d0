"""Console fixtures: the integration gateway (a real nats-server and SQLite file) and, for the browser tests,
Debian's chromium driven by Playwright."""

from __future__ import annotations

from ..integration.conftest import api, gateway, node

__all__ = ["api", "gateway", "node"]
