"""Console fixtures: the integration gateway (a real nats-server and SQLite file) and, for the browser tests,
Debian's chromium driven by Playwright for Python (its own browser download is not used)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator

import pytest

from ..integration.conftest import api, gateway, node

__all__ = ["api", "browser", "chromium_path", "gateway", "node"]


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's chromium; installed with apt-get when it is missing and we are root (a fresh machine)."""
    path = shutil.which("chromium")
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "chromium"], env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(["apt-get", "install", "-y", "chromium"], env=env, check=True)
        path = shutil.which("chromium")
    if path is None:
        pytest.fail("the console's browser tests need chromium (apt-get install chromium)")
    return path


@pytest.fixture
async def browser(chromium_path: str) -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=chromium_path, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            await b.close()
