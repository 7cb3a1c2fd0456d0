"""Fast paths that replace slower library calls must answer what the library answers."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.msg import Msg

from scheduler_gateway.daemon.http.event_hub import stream_seq

REPLIES = [
    "$JS.ACK.GW_EVENTS.ordered123.1.4711.4711.1764540000000000000.0",  # v1: 9 tokens
    "$JS.ACK._.ACCHASH.GW_EVENTS.ordered123.1.4712.12.1764540000000000000.3",  # v2: 11 tokens
    "$JS.ACK.dom.ACCHASH.GW_EVENTS.ordered123.2.99.98.1764540000000000000.0.rnd",  # v2 with a random token
]


@pytest.mark.parametrize("reply", REPLIES)
def test_stream_seq_matches_nats_metadata(reply: str) -> None:
    assert stream_seq(reply) == Msg.Metadata._from_reply(reply).sequence.stream


@pytest.mark.parametrize("reply", [None, "", "_INBOX.abc", "$JS.ACK.a.b.c", "$JS.ACK.S.C.1.x.1.1.0"])
def test_stream_seq_refuses_what_is_no_delivery(reply: str | None) -> None:
    with pytest.raises((ValueError, IndexError)):
        stream_seq(reply)


def test_fmt_ts_answers_what_datetime_answers_for_seconds_in_any_order() -> None:
    import random
    from datetime import UTC, datetime

    from scheduler_gateway.wire import timefmt

    rng = random.Random(7)
    # more distinct seconds than the cache keeps, revisited out of order, and whole-second and rounding edges
    instants = [rng.uniform(0, 4e9) for _ in range(3 * timefmt._SECONDS_KEPT)] + [0.0, 1.9995, 59.9996, 1e9]
    for at in instants + instants[::-1]:
        ms = round(at * 1000)
        want = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
        assert timefmt.fmt_ts(at) == want
    assert len(timefmt._SECONDS) <= timefmt._SECONDS_KEPT
    assert timefmt.fmt_ts(None) is None


def test_an_outbox_row_of_either_layout_reads_as_the_message_the_full_decode_would_encode() -> None:
    """A row is written ready to publish, and a row of the layout before (the EventRecord) is converted when
    read: both give the stream message that decoding the event in full and encoding it gives."""
    import msgspec

    from scheduler_gateway.actors.model.records import EventRecord
    from scheduler_gateway.actors.outbox import OutboxEntry, outbox_body, read_outbox_body, to_wire

    rec = EventRecord(
        id="evt_1", type="task.succeeded", aggregate_type="task", aggregate_id="tsk_1", owner="alice", revision=3,
        at=1764540000.25, request_id="req_1",
        data={"task": {"id": "tsk_1", "result": {"n": [1, 2.5, None, "é\u2028"], "big": 2**62}}},
    )  # fmt: skip
    earlier = msgspec.json.encode(rec)
    full = msgspec.json.encode(to_wire(msgspec.json.decode(earlier, type=EventRecord)))
    for body in (earlier, outbox_body(rec)):
        entry = read_outbox_body(body)
        assert isinstance(entry, OutboxEntry)
        assert (entry.id, entry.aggregate_type, entry.type, entry.at) == (rec.id, "task", "task.succeeded", rec.at)
        assert bytes(entry.wire) == full


# -- bench/bench_gateway.py --store postgres (issue 50 point 4): its helpers that need no process -----------------


def _bench_module(name: str) -> Any:
    import importlib
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[2] / "bench")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(bench)


def _stat(pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0, name: str = "postgres") -> str:
    # /proc/<pid>/stat: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime ...; the name may hold spaces and parentheses
    return f"{pid} ({name}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 1 0 5 0\n"


def test_a_process_tree_cpu_counts_the_live_descendants_and_the_reaped_ones_once(tmp_path: Any) -> None:
    """PostgreSQL's CPU is its postmaster's tree: the root's own and reaped children's time (cutime/cstime, the
    backends that ended) plus every live descendant's own; other processes, even a child of a descendant's
    sibling outside the tree, are not counted."""
    procs_cpu = _bench_module("procs_cpu")
    tck = procs_cpu.CLK_TCK
    files = {
        100: _stat(100, 1, utime=10, stime=5, cutime=7, cstime=3),  # the postmaster; 10 ticks reaped
        101: _stat(101, 100, utime=20, stime=4, name="postgres: bench (idle) x) y"),  # a backend
        102: _stat(102, 100, utime=1, stime=1, cutime=50, cstime=50),  # its reaped children are not ours to add
        103: _stat(103, 102, utime=2, stime=0),  # a grandchild
        200: _stat(200, 1, utime=999, stime=999),  # another process
        201: _stat(201, 200, utime=999, stime=999),
    }
    for pid, text in files.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(text)
    (tmp_path / "self").mkdir()  # not a pid: ignored
    assert procs_cpu.descendants(100, procs_cpu.parents(tmp_path)) == {101, 102, 103}
    want = (10 + 5 + 7 + 3) + (20 + 4) + (1 + 1) + 2
    assert procs_cpu.tree_cpu_s(100, tmp_path) == pytest.approx(want / tck)
    assert procs_cpu.pids_cpu_s([101, 103], tmp_path) == pytest.approx(26 / tck)
    assert procs_cpu.tree_cpu_s(999, tmp_path) != procs_cpu.tree_cpu_s(999, tmp_path)  # gone: NaN
    assert procs_cpu.pids_cpu_s([101, 999], tmp_path) != procs_cpu.pids_cpu_s([101, 999], tmp_path)


def test_a_child_that_ended_still_counts_in_its_parents_tree() -> None:
    """Live: a child that burns CPU and is waited for shows in this process's tree CPU (the reaped children's
    time), as a PostgreSQL backend that ends inside the measured window does."""
    import subprocess
    import sys

    procs_cpu = _bench_module("procs_cpu")
    import os

    before = procs_cpu.tree_cpu_s(os.getpid())
    child = subprocess.run(
        [sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"],
        check=True,
    )
    assert child.returncode == 0
    assert procs_cpu.tree_cpu_s(os.getpid()) - before >= 0.25


def _args(*argv: str) -> Any:
    return _bench_module("bench_gateway").parse_args(list(argv))


def test_the_store_and_instances_options_are_checked_and_postgres_submits_in_batches() -> None:
    bg = _bench_module("bench_gateway")
    today = bg.shape_of(_args())
    assert (today.stores, today.instances, today.submits) == (("sqlite",), (1,), ("single",))
    assert today.gateway_runs() == [("single", "sqlite", 1)]
    pg = bg.shape_of(_args("--store", "postgres", "--instances", "2"))
    assert pg.gateway_runs() == [("batch", "postgres", 2)]
    both = bg.shape_of(_args("--store", "sqlite,postgres", "--instances", "1,2", "--submit", "batch"))
    assert both.gateway_runs() == [("batch", "sqlite", 1), ("batch", "postgres", 1), ("batch", "postgres", 2)]
    for bad in (
        ["--store", "mysql"],
        ["--store", ""],
        ["--store", "postgres", "--instances", "0"],
        ["--store", "postgres", "--instances", "two"],
        ["--store", "postgres", "--instances", "17"],
        ["--instances", "2"],  # SQLite is one gatewayd
        ["--store", "postgres", "--submit", "bulk"],
    ):
        with pytest.raises(SystemExit):
            bg.shape_of(_args(*bad))


def test_the_summary_compares_each_gateway_shape_with_its_peer_sqlite_and_one_instance() -> None:
    bg = _bench_module("bench_gateway")
    systems = ["gateway-batch", "gateway-batch pg x1", "gateway-batch pg x2", "dramatiq", "procrastinate"]
    assert bg.ratio_pairs(systems) == [
        ("gateway-batch", "dramatiq"),
        ("gateway-batch pg x1", "procrastinate"),
        ("gateway-batch pg x1", "gateway-batch"),
        ("gateway-batch pg x2", "procrastinate"),
        ("gateway-batch pg x2", "gateway-batch"),
        ("gateway-batch pg x2", "gateway-batch pg x1"),
    ]
    assert bg.ratio_pairs(["gateway", "floor", "dramatiq"]) == [
        ("gateway", "floor"),
        ("gateway", "dramatiq"),
        ("dramatiq", "floor"),
    ]


def test_the_procrastinate_figures_come_from_its_events_and_count_repeats_and_the_unfinished() -> None:
    """One row per job: (id, deferred, started, finished, starts, terminal events), epoch seconds."""
    peer = _bench_module("peer_procrastinate")
    rows = [
        (1, 100.0, 100.5, 101.0, 1, 1),
        (2, 100.0, 100.2, 102.0, 2, 1),  # started twice: a repeat
        (3, 100.1, None, None, 0, 0),  # never finished: lost
        (4, 100.1, 100.3, 100.4, 1, 1),
    ]
    rec = peer.figures(rows, 4)
    assert (rec["created"], rec["terminal"], rec["lost"], rec["duplicates"]) == (4, 3, 1, 1)
    assert rec["secs"] == pytest.approx(2.0)
    assert rec["tasks_per_s"] == pytest.approx(1.5)
    assert rec["queue_p50_ms"] == pytest.approx(200.0)
    assert rec["exec_max_ms"] == pytest.approx(1800.0)


def test_the_transitions_of_an_instance_are_read_by_action_from_its_metrics() -> None:
    bg = _bench_module("bench_gateway")
    text = (
        "# HELP gw_task_transitions_total Task state changes by kind, action and resulting state\n"
        "# TYPE gw_task_transitions_total counter\n"
        'gw_task_transitions_total{action="create",kind="echo",state="queued"} 120.0\n'
        'gw_task_transitions_total{action="create",kind="sleep",state="queued"} 5.0\n'
        'gw_task_transitions_total{action="claim",kind="echo",state="running"} 60.0\n'
        'gw_task_transitions_created{action="claim",kind="echo",state="running"} 1.7e9\n'
        'gw_http_requests_total{route="/api/tasks",status="2xx"} 9.0\n'
    )
    assert bg.transitions_by_action(text) == {"create": 125.0, "claim": 60.0}
