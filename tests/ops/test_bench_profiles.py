"""``bench/profiles.py``: py-spy's raw stacks reduced to the own and inclusive shares docs/PERFORMANCE.md quotes.

Nothing is timed: a fixed text of collapsed stacks in, the shares out."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import profiles  # noqa: E402

RAW = "\n".join(
    [
        "thread (0x7f01): MainThread;main (/x/lib/python3.11/site-packages/app/cli.py:3);"
        "a (/x/src/app/a.py:10);leaf (/x/src/app/b.py:20) 6",
        "thread (0x7f01): MainThread;main (/x/lib/python3.11/site-packages/app/cli.py:3);a (/x/src/app/a.py:10) 2",
        "thread (0x7f01): MainThread;main (/x/lib/python3.11/site-packages/app/cli.py:3);"
        "a (/x/src/app/a.py:10);a (/x/src/app/a.py:10) 2",
        "a line that is not a stack",
    ]
)


def test_the_thread_frame_and_the_paths_are_dropped() -> None:
    st = profiles.parse(RAW)
    assert sum(st.values()) == 10
    assert ("main (app/cli.py)", "a (app/a.py)", "leaf (app/b.py)") in st


def test_own_shares_count_each_sample_for_its_leaf() -> None:
    own = dict(profiles.self_shares(profiles.parse(RAW)))
    assert own == {"leaf (app/b.py)": 0.6, "a (app/a.py)": 0.4}


def test_inclusive_shares_count_a_recursive_function_once_per_sample() -> None:
    incl = dict(profiles.inclusive_shares(profiles.parse(RAW)))
    assert incl["main (app/cli.py)"] == 1.0
    assert incl["a (app/a.py)"] == 1.0  # 6 + 2 + 2 samples, the recursive stack once
    assert incl["leaf (app/b.py)"] == 0.6


def test_a_report_holds_each_process_and_the_statements(tmp_path: Path) -> None:
    (tmp_path / "gatewayd0.txt").write_text(RAW)
    rec = {
        "system": "gateway-batch pg x1",
        "n": 10,
        "tasks_per_s": 5.0,
        "cpu_ms_per_task": 1.0,
        "gatewayd_cpu_ms_per_task": 0.5,
        "pg_calls_per_task": 2.0,
        "pg_exec_ms_per_task": 0.3,
        "pg_statements": [{"us_per_task": 200.0, "calls_per_task": 0.5, "rows_per_call": 3.0, "query": "SELECT 1"}],
    }
    text = profiles.report(rec, tmp_path).read_text()
    assert "### gatewayd0 (10 busy samples)" in text
    assert "| `leaf (app/b.py)` | 60.0% |" in text
    assert "| 200.0 | 0.500 | 400.0 | 3.0 | `SELECT 1` |" in text
