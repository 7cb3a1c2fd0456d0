"""The benchmark scripts in ``bench/`` still run against the code as it is: docs/PERFORMANCE.md's figures are
reproduced with them, so a refactor that breaks one must fail here, not at the next measurement.

Each ``bench_*.py`` script is started with ``--help`` (its imports and argument parser); the two that build
a task's changes through the task ledger's own ``change`` (the same shim ``bench_growth`` and
``bench_console`` fill stores with) also run on a few tasks.
Nothing here is timed: the figures are the scripts' business."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("bench_*.py"))


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_bench_script_starts(script: str, tmp_path: Path) -> None:
    done = _run(str(BENCH / script), "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_the_scripts_found_are_the_bench_scripts() -> None:
    assert {"bench_gateway.py", "bench_growth.py", "bench_change_rows.py", "bench_write_cost.py"} <= set(SCRIPTS)


def test_the_dramatiq_peer_module_imports(tmp_path: Path) -> None:
    """``peer_dramatiq`` is imported by ``bench_gateway.py --peers`` and by the dramatiq workers; it has no CLI."""
    done = _run("-c", f"import sys; sys.path.insert(0, {str(BENCH)!r}); import peer_dramatiq", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


def test_change_rows_builds_a_few_tasks(tmp_path: Path) -> None:
    done = _run(str(BENCH / "bench_change_rows.py"), "--tasks", "200", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "all three changes" in done.stdout


def test_write_cost_writes_a_few_tasks(tmp_path: Path) -> None:
    done = _run(str(BENCH / "bench_write_cost.py"), "--tasks", "200", "--runs", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "claim+settle" in done.stdout


def test_overlap_splits_the_starts_at_the_last_create() -> None:
    """``bench_gateway``'s overlap figures: 4 creates over 2 s, 2 starts before the last create, 3 in the 1.5 s
    after it."""
    sys.path.insert(0, str(BENCH))
    try:
        from bench_gateway import overlap
    finally:
        sys.path.remove(str(BENCH))
    got = overlap([10.0, 10.5, 11.0, 12.0], [10.2, 12.0, 12.5, 13.0, 13.5])
    assert got == {"creates_s": 2.0, "starts_per_s_creating": 1.0, "starts_per_s_after": 2.0}
    assert all(v != v for v in overlap([], []).values())  # NaN: nothing to split
