"""Profiles of every process of a bench run, reduced to short tables (``bench_gateway.py --profile DIR``).

This module owns three things, none of the run itself:

- recording: ``Spy`` runs ``py-spy record`` on one process for the whole measured window (started with the
  creates, stopped by SIGINT when the window ends, so the samples cover the same seconds as the CPU figures), in
  py-spy's raw format (collapsed stacks, one ``frame;frame;... count`` line each, aggregated by function, idle
  samples left out: a share is a share of the process's busy samples);
- reducing: ``stacks`` reads such a file, ``self_shares`` counts each sample once for the function it was in
  (its leaf frame: where the CPU went), ``inclusive_shares`` once for every distinct function on its stack
  (what a call costs with everything it calls);
- writing: ``report`` turns a run's record (its CPU per task by process, PostgreSQL's statement and function
  statistics from bench/pg_counts.py) and its profiles into one markdown file, the tables the lead and
  docs/PERFORMANCE.md quote.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: a frame as py-spy writes it: ``function (path/to/file.py:line)``
_FRAME = re.compile(r"\A(?P<func>.*?) \((?P<file>.*):(?P<line>\d+)\)\Z")
#: the thread frame ``--threads`` puts first: ``thread (0x7f..)`` or ``thread (123): MainThread``
_THREAD = re.compile(r"\Athread \([^)]*\)(?::.*)?\Z")
#: path prefixes cut from a frame's file so that it reads as a module (site-packages, the repo's src)
_PREFIXES = re.compile(r"\A.*/(?:site-packages|src|lib/python3\.\d+)/")

Stacks = Counter[tuple[str, ...]]


def frame_name(frame: str) -> str:
    """``function (module/file.py)``: the line number and the directories up to the package dropped."""
    m = _FRAME.fullmatch(frame)
    if m is None:
        return frame
    return f"{m['func']} ({_PREFIXES.sub('', m['file'])})"


def parse(text: str) -> Stacks:
    """Collapsed stacks (root first) and their sample counts, the thread frame dropped."""
    out: Stacks = Counter()
    for line in text.splitlines():
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        frames = [f for f in head.split(";") if not _THREAD.fullmatch(f)]
        if frames:
            out[tuple(frame_name(f) for f in frames)] += int(count)
    return out


def stacks(path: Path) -> Stacks:
    return parse(path.read_text()) if path.exists() else Counter()


def self_shares(st: Stacks) -> list[tuple[str, float]]:
    """(function, share of all samples) by the samples whose leaf it is, largest first."""
    total = sum(st.values())
    own: Counter[str] = Counter()
    for frames, n in st.items():
        own[frames[-1]] += n
    return [(f, n / total) for f, n in own.most_common()] if total else []


def inclusive_shares(st: Stacks) -> list[tuple[str, float]]:
    """(function, share of all samples) by the samples with it anywhere on the stack (counted once per sample,
    recursion or not), largest first."""
    total = sum(st.values())
    incl: Counter[str] = Counter()
    for frames, n in st.items():
        for f in set(frames):
            incl[f] += n
    return [(f, n / total) for f, n in incl.most_common()] if total else []


def _py_spy() -> str | None:
    return shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")


class Spy:
    """``py-spy record`` on one process until ``stop``; the raw stacks in ``out``."""

    def __init__(self, pid: int, out: Path, rate: int) -> None:
        self.pid = pid
        self.out = out
        self.rate = rate
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> bool:
        exe = _py_spy()
        if exe is None:
            print("py-spy not found (pip install py-spy); no profile", file=sys.stderr)
            return False
        self.out.parent.mkdir(parents=True, exist_ok=True)
        # --function: samples aggregated by function (its first line), not by the line being run
        self.proc = await asyncio.create_subprocess_exec(
            exe,
            "record",
            "--pid",
            str(self.pid),
            "--rate",
            str(self.rate),
            "--threads",
            "--function",
            "--format",
            "raw",
            "-o",
            str(self.out),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return True

    async def stop(self) -> None:
        """SIGINT: py-spy writes what it sampled so far and exits."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def targets(pids: dict[str, list[int | None]], out: Path) -> list[tuple[int, Path]]:
    """(pid, file) of each Python process of a run: ``gatewayd<k>.txt`` per instance, ``worker<i>.txt`` per
    worker, ``client.txt`` for this bench (which submits and polls)."""
    found = [(pid, out / f"gatewayd{k}.txt") for k, pid in enumerate(pids.get("gatewayd", [])) if pid]
    found += [(pid, out / f"worker{i}.txt") for i, pid in enumerate(pids.get("workers", [])) if pid]
    found.append((os.getpid(), out / "client.txt"))
    return found


async def start_spies(pids: dict[str, list[int | None]], out: Path, rate: int) -> list[Spy]:
    spies = [Spy(pid, path, rate) for pid, path in targets(pids, out)]
    return [s for s in spies if await s.start()]


def _table(rows: Iterable[tuple[str, float]], top: int, title: str) -> list[str]:
    lines = [f"| {title} | share |", "|---|---|"]
    lines += [f"| `{f}` | {100 * share:.1f}% |" for f, share in list(rows)[:top]]
    return lines


def profile_tables(path: Path, top_self: int = 12, top_incl: int = 8) -> list[str]:
    """A process's two tables: its top functions by own samples and by inclusive samples."""
    st = stacks(path)
    total = sum(st.values())
    if not total:
        return [f"### {path.stem}: no samples", ""]
    lines = [f"### {path.stem} ({total} busy samples)", ""]
    lines += _table(self_shares(st), top_self, "own (self)")
    lines.append("")
    # the interpreter's and the event loop's entry frames are on every stack: 100% says nothing
    incl = [(f, s) for f, s in inclusive_shares(st) if s < 0.985]
    lines += _table(incl, top_incl, "inclusive (below the loop's entry)")
    lines.append("")
    return lines


_CPU_GROUPS = ("gatewayd", "nats", "postgres", "workers", "client")


def cpu_line(rec: dict[str, Any]) -> str:
    parts = [f"{g} {rec[f'{g}_cpu_ms_per_task']:.3f}" for g in _CPU_GROUPS if f"{g}_cpu_ms_per_task" in rec]
    return f"CPU ms per task: all {rec.get('cpu_ms_per_task', float('nan')):.3f} ({', '.join(parts)})"


def statement_table(rec: dict[str, Any], top: int = 25) -> list[str]:
    """PostgreSQL's statements of the window (pg_stat_statements), the costliest first: us per task, calls per
    task, us and rows per call."""
    stmts = rec.get("pg_statements") or []
    if not stmts:
        return []
    lines = [
        f"PostgreSQL: {rec['pg_calls_per_task']:.2f} top-level statements and {rec['pg_exec_ms_per_task']:.3f} ms"
        " of execution per task (pg_stat_statements' total_exec_time: time from start to end, waits for a core"
        " or a lock included, so on a busy machine more than the CPU; `(nested)`: run inside another statement, a"
        " trigger's, its time also in its caller's)",
        "",
        "| us per task | calls per task | us per call | rows per call | statement |",
        "|---|---|---|---|---|",
    ]
    for s in stmts[:top]:
        per_call = s["us_per_task"] / s["calls_per_task"] if s["calls_per_task"] else float("nan")
        query = s["query"][:200].replace("|", "\\|")
        lines.append(
            f"| {s['us_per_task']:.1f} | {s['calls_per_task']:.3f} | {per_call:.1f} | {s['rows_per_call']:.1f} |"
            f" `{query}` |"
        )
    lines.append("")
    funcs = rec.get("pg_functions") or []
    if funcs:
        lines += ["| function (trigger) | us per task, own | calls per task |", "|---|---|---|"]
        lines += [f"| `{f['name']}` | {f['self_us_per_task']:.1f} | {f['calls_per_task']:.3f} |" for f in funcs]
        lines.append("")
    return lines


def report(rec: dict[str, Any], out: Path) -> Path:
    """``out/report.md``: the run's CPU by process, each Python process's tables, PostgreSQL's statements."""
    lines = [
        f"# {rec.get('system')}: N = {rec.get('n')}, {rec.get('tasks_per_s', float('nan')):.0f} tasks/s",
        "",
        cpu_line(rec) + f"; machine {rec.get('machine_cpu_pct', float('nan')):.0f}% busy, of which others"
        f" {rec.get('other_cpu_pct', float('nan')):.0f}%; load {rec.get('loadavg_1m', float('nan'))}",
        "",
    ]
    for path in sorted(out.glob("*.txt")):
        lines += profile_tables(path)
    lines += statement_table(rec)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
