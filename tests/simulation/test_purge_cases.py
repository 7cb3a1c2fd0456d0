"""Cases of the retention purge replayed step by step on the simulation's machine: each failed before the fix
named in its docstring."""

from __future__ import annotations

from scheduler_gateway.daemon.store import sqlite_conn

from .machine import SimMachine


def test_a_purged_task_the_machine_never_saw_created_keeps_its_history_for_the_checks() -> None:
    """A create whose process dies right after its event is published commits a task whose answer is lost, so
    the machine never lists it. It runs, succeeds, its callback is posted, and retention purges it. The purge
    rule recorded the history of the tasks it listed only, and the callback, naming the task's terminal revision,
    looked unfounded (the soak's ``callbacks_name_terminal_revisions: ... not a terminal revision of its task``,
    two instances). The rule now records every task that leaves the store."""
    m = SimMachine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0))
    try:
        m.holds()
        m.chaos(k=1, what="outage")  # the next publish, the create's event: its process dies right after it
        m.create_task(approval=False, callback="ok", ckey=None, delay=None, key=None, kind="echo", labels="none",
                      lease=None, max_attempts=1, parent=None, priority=0, thread=None, timeout=None, ufor=None,
                      ukey=None, user="alice")  # fmt: skip
        m.holds()
        assert m.sim is not None and not m.task_ids  # committed, its answer lost
        (stored,) = m.view.tasks()
        m.advance(seconds=61.0)  # the outage's downtime
        m.holds()
        m.claim_all(n=0)
        m.settle(i=0, n=0, outcome="succeeded", retryable=False, variant="normal")
        m.holds()
        m.advance(seconds=61.0)  # the callback is posted
        m.holds()
        posted = [h.get("X-Callback-Id", "") for w in m.sim.worlds if w is not None for _, h, _ in w.poster.posts]
        assert any(p.startswith(stored + ":") for p in posted), posted
        m.purge_finished(keep=30.0)
        m.holds()
        assert stored in m.purged and not m.view.tasks()
    finally:
        m.teardown()


def test_a_task_purged_after_the_purge_step_keeps_the_history_that_committed_before() -> None:
    """On SQLite a user's cancel of a queued task is still under way when its step ends (the writer's 1 ms linger,
    as gatewayd has it: the simulation turns it off, so it is put back here); the purge's step
    (``tasks_s`` 0) ends before its delete did too. In the next step the cancel commits and the purge then
    deletes the task, and the callback of the cancel is posted. The purge rule had read the history before its
    step (revision 1 only) and never saw the task go, so the callback naming revision 2 looked unfounded (the
    SQLite soak's ``callbacks_name_terminal_revisions``, seed 202302057, shrunk). The checks now take a gone
    task's history from every change the store answered as committed as well."""
    machine = type("OnSqlite", (SimMachine,), {"on_sqlite": True})
    m = machine()
    m.boot(seed=0, skews=(0.0, 0.0, 0.4), epoch="ny-fall", nats_skew=0.0)
    sqlite_conn.LINGER_S = 0.001  # the simulation's close puts back what it found
    try:
        for _ in range(18):
            m.advance(seconds=0.5)
        m.create_task(approval=False, callback="fail", ckey=None, delay=None, key=None, kind="echo", labels="none",
                      lease=None, max_attempts=1, parent=None, priority=0, thread=None, timeout=None, ufor=None,
                      ukey=None, user="alice")  # fmt: skip
        (tid,) = m.task_ids
        m.act(action="cancel", apt=False, i=0, key=None, revision="none", who="owner")
        m.create_batch(approvals=[False] * 4, ckeys=[None] * 4, kinds=["echo", "echo"], thread=None, ufor=None,
                       ukeys=[None] * 4, user="alice")  # fmt: skip
        m.holds()
        m.purge_finished(keep=0.0)
        m.holds()
        m.advance(seconds=0.5)
        assert tid not in m.view.tasks() and tid not in m.purged  # gone, but not while the purge rule looked
        m.holds()
    finally:
        m.teardown()
