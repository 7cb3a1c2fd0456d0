"""Imports point inward only: daemon -> actors -> wire. ``wire`` imports nothing of ours; ``actors`` imports
no aiohttp, nats or aiosqlite (and nothing of ``daemon``)."""

from __future__ import annotations

import ast
from pathlib import Path

import scheduler_gateway

ROOT = Path(scheduler_gateway.__file__).parent


def imports_of(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: stays inside the package
                    continue
                names.add(node.module or "")
        found[str(path.relative_to(ROOT))] = names
    return found


def test_wire_imports_nothing_of_ours() -> None:
    for path, names in imports_of("wire").items():
        ours = {n for n in names if n.startswith("scheduler_gateway") and not n.startswith("scheduler_gateway.wire")}
        assert not ours, f"{path} imports {ours}"


def test_actors_import_no_adapters() -> None:
    forbidden = ("aiohttp", "nats", "aiosqlite", "sqlite3", "scheduler_gateway.daemon", "prometheus_client")
    for path, names in imports_of("actors").items():
        bad = {n for n in names if n.split(".")[0] in forbidden or n.startswith(forbidden)}
        assert not bad, f"{path} imports {bad}"


def test_model_is_pure() -> None:
    # datetime is allowed for calendar arithmetic (cron in a time zone is the schedule model's own domain
    # knowledge, docs/DECISIONS.md, Model purity); reading the clock through it is not: see the next test.
    impure = ("time", "random", "os", "asyncio", "uuid", "secrets")
    for path, names in imports_of("actors/model").items():
        bad = {n for n in names if n.split(".")[0] in impure}
        assert not bad, f"{path} imports {bad}"


def test_model_reads_no_clock() -> None:
    clock_reads = {"now", "utcnow", "today"}
    for path in (ROOT / "actors" / "model").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in clock_reads, f"{path.name}:{node.lineno} reads the clock"
