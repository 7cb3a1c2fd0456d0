"""The worker SDK has one home (issue 51 point 8): ``scheduler_gateway.worker``. The old alias modules
``scheduler_gateway.daemon.worker`` and ``daemon.worker_cli`` are gone, and the ``gateway-worker`` console script
names the real module, in pyproject.toml and in the installed package's metadata, and runs."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL_HOME = "scheduler_gateway.worker._cli:worker_main"


@pytest.mark.parametrize("old", ["scheduler_gateway.daemon.worker", "scheduler_gateway.daemon.worker_cli"])
def test_the_old_alias_modules_are_gone(old: str) -> None:
    assert importlib.util.find_spec(old) is None, f"{old} still exists: every import names the real home"


def test_the_console_script_names_the_real_module() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gateway-worker"] == REAL_HOME
    installed = {ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert installed["gateway-worker"].value == REAL_HOME, "reinstall: pip install -e . --no-deps"
    assert callable(installed["gateway-worker"].load())


def test_gateway_worker_runs() -> None:
    script = Path(sys.executable).parent / "gateway-worker"
    assert script.exists(), f"{script} is not installed"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "--node-id" in done.stdout
