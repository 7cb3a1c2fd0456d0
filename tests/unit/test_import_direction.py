"""Imports point inward only: daemon -> actors -> wire; worker and client -> wire. ``wire`` imports nothing of
ours; ``actors`` imports no aiohttp, nats or aiosqlite (and nothing of ``daemon``, ``worker`` or ``client``); the
worker SDK and the client import ``wire`` only. Relative imports are resolved to absolute names first, so
``from ..daemon import x`` counts like ``from scheduler_gateway.daemon import x``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import scheduler_gateway

ROOT = Path(scheduler_gateway.__file__).parent


def module_name(path: Path) -> str:
    """``.../scheduler_gateway/worker/_cli.py`` -> ``scheduler_gateway.worker._cli`` (a package is its ``__init__``)."""
    parts = ["scheduler_gateway", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(node: ast.ImportFrom, module: str, is_package: bool) -> set[str]:
    """The absolute names an ``import from`` brings: ``from . import x`` in package ``p`` is ``p.x``, since
    ``x`` may be a submodule; ``from ..wire import y`` in ``p.q.m`` is ``p.wire`` (and ``p.wire.y``)."""
    if not node.level:
        base = node.module or ""
    else:
        package = module.split(".") if is_package else module.split(".")[:-1]
        keep = len(package) - (node.level - 1)
        assert keep > 0, f"{module}: relative import beyond the top package"
        base = ".".join(package[:keep] + ([node.module] if node.module else []))
    return {base} | {f"{base}.{alias.name}" for alias in node.names if alias.name != "*"}


def imports_of(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        module, is_package = module_name(path), path.name == "__init__.py"
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                names |= resolve(node, module, is_package)
        found[str(path.relative_to(ROOT))] = names
    return found


def ours_outside(names: set[str], allowed: tuple[str, ...]) -> set[str]:
    """Our own modules among ``names`` that are not in (or below) one of the ``allowed`` packages."""
    return {
        n
        for n in names
        if (n == "scheduler_gateway" or n.startswith("scheduler_gateway."))
        and not any(n == a or n.startswith(a + ".") for a in allowed)
    }


def test_resolve_relative_imports() -> None:
    def names(code: str, module: str, is_package: bool = False) -> set[str]:
        node = ast.parse(code).body[0]
        assert isinstance(node, ast.ImportFrom)
        return resolve(node, module, is_package)

    assert names("from . import x", "scheduler_gateway.worker._cli") == {
        "scheduler_gateway.worker",
        "scheduler_gateway.worker.x",
    }
    assert names("from ._context import T", "scheduler_gateway.worker", is_package=True) >= {
        "scheduler_gateway.worker._context"
    }
    assert "scheduler_gateway.daemon" in names("from ..daemon import config", "scheduler_gateway.worker._cli")
    assert "scheduler_gateway.wire.errors" in names("from ..wire.errors import Code", "scheduler_gateway.worker._x")
    assert "scheduler_gateway.daemon" in names("from ... import daemon", "scheduler_gateway.actors.model.cron")


def test_relative_imports_are_seen() -> None:
    # The worker package imports its own private modules relatively: proof the walk sees relative imports.
    assert "scheduler_gateway.worker._runtime" in imports_of("worker")["worker/__init__.py"]


def test_wire_imports_nothing_of_ours() -> None:
    for path, names in imports_of("wire").items():
        ours = ours_outside(names, ("scheduler_gateway.wire",))
        assert not ours, f"{path} imports {ours}"


@pytest.mark.parametrize("package", ["worker", "client"])
def test_sdk_packages_import_wire_only(package: str) -> None:
    """The worker SDK (and the client, once it exists) is what users install next to their own code: it
    brings the wire protocol and nothing of the daemon or the actors (and ``tracing``, which is wire-only too)."""
    if not (ROOT / package).is_dir():
        pytest.skip(f"no {package} package yet")
    for path, names in imports_of(package).items():
        allowed = (f"scheduler_gateway.{package}", "scheduler_gateway.wire", "scheduler_gateway.tracing")
        # ``from scheduler_gateway import tracing`` names the top package too; what it brings is checked by name
        ours = ours_outside(names, allowed) - {"scheduler_gateway"}
        assert not ours, f"{path} imports {ours}"


def test_tracing_imports_wire_only() -> None:
    """``scheduler_gateway.tracing`` (OpenTelemetry glue shared by gatewayd, the worker SDK and the client)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse((ROOT / "tracing.py").read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names |= resolve(node, "scheduler_gateway.tracing", False)
    assert not ours_outside(names, ("scheduler_gateway.wire", "scheduler_gateway.tracing"))


def test_gatewayctl_is_built_on_the_client() -> None:
    """``gatewayctl`` (``ctl``) speaks the HTTP API through ``scheduler_gateway.client`` only."""
    for path, names in imports_of("ctl").items():
        ours = ours_outside(names, ("scheduler_gateway.ctl", "scheduler_gateway.client", "scheduler_gateway.wire"))
        assert not ours, f"{path} imports {ours}"


def test_actors_import_no_adapters() -> None:
    forbidden = (
        "aiohttp",
        "nats",
        "aiosqlite",
        "sqlite3",
        "scheduler_gateway.daemon",
        "scheduler_gateway.worker",
        "scheduler_gateway.client",
        "prometheus_client",
    )
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


# The daemon's concerns (docs/ARCHITECTURE.md): each subpackage is an adapter of one kind and imports no other
# adapter's library or subpackage; only the top of ``daemon`` (the composition root, the CLIs) joins them.
# ``http`` reads the event stream through the NATS bus (the SSE hub), and ``store`` reads ``config`` for backup.
DAEMON_CONCERNS = {
    "config": ((), ("aiohttp", "nats", "aiosqlite", "sqlite3")),
    "store": (("config",), ("aiohttp", "nats")),
    "nats": ((), ("aiohttp", "aiosqlite", "sqlite3")),
    "http": (("nats", "metrics", "metrics_events"), ("aiosqlite", "sqlite3")),
}


@pytest.mark.parametrize("concern", sorted(DAEMON_CONCERNS))
def test_daemon_concerns_stay_apart(concern: str) -> None:
    allowed_ours, forbidden_libs = DAEMON_CONCERNS[concern]
    allowed = tuple(f"scheduler_gateway.daemon.{m}" for m in (concern, *allowed_ours))
    for path, names in imports_of(f"daemon/{concern}").items():
        daemon_names = {n for n in names if n.startswith("scheduler_gateway.daemon.")}
        ours = {n for n in ours_outside(daemon_names, allowed) if n != "scheduler_gateway.daemon"}
        assert not ours, f"{path} imports {ours}"
        libs = {n for n in names if n.split(".")[0] in forbidden_libs}
        assert not libs, f"{path} imports {libs}"


def test_daemon_concerns_are_packages() -> None:
    for concern in DAEMON_CONCERNS:
        assert (ROOT / "daemon" / concern / "__init__.py").is_file(), concern
