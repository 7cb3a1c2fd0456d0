"""The package ships its type hints (PEP 561): one ``py.typed`` at ``scheduler_gateway``'s root, in the package
data pyproject.toml gives setuptools, so the typed client and the worker SDK are typed for their users' checkers
(issue 51 point 2)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import scheduler_gateway

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(scheduler_gateway.__file__).parent


def test_one_marker_at_the_package_root_and_in_the_package_data() -> None:
    assert (PACKAGE / "py.typed").is_file()
    # the root's marker covers every subpackage: a second one below it says nothing more
    assert sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("py.typed")) == [Path("py.typed")]
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["scheduler_gateway"]


def test_a_users_checker_sees_the_clients_types(tmp_path: Path) -> None:
    """mypy over a user's module, with the package as installed in this interpreter: the client's types are
    read (a wrong one is an error), not skipped as "installed, but missing library stubs or py.typed"."""
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\n")
    (tmp_path / "user.py").write_text(
        "from scheduler_gateway.client import GatewayClient\n"
        "from scheduler_gateway.worker import TaskContext\n"
        "url: int = GatewayClient('http://127.0.0.1:8080').base_url\n"
        "def handle(ctx: TaskContext) -> None: ...\n"
    )
    args = ["--config-file", "mypy.ini", "--no-incremental", "--python-executable", sys.executable, "user.py"]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=tmp_path, capture_output=True, text=True, timeout=110, check=False
    )
    assert "py.typed" not in done.stdout, done.stdout
    assert 'user.py:3: error: Incompatible types in assignment (expression has type "str"' in done.stdout, done.stdout
    assert "Found 1 error in 1 file" in done.stdout, done.stdout
