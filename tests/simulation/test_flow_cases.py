"""Cases of the flow invariants (fair turns, limits) replayed step by step on the simulation's machine: each
failed before the fix named in its docstring."""

from __future__ import annotations

from .machine import SimMachine


def test_a_refused_claim_of_a_threads_later_task_puts_its_head_back_in_line() -> None:
    """A dead task of a thread is retried by force while the thread's next task is on offer from the same
    instance: the retried task is the lane's head again, skipped while the lane is taken, and the store refuses
    the offered task's claim for it. The dispatcher put the refused task back in line, not the head, so the head
    waited while other keys of its kind were offered (``fair_turns_between_keys: key None of kind echo offered
    twice ... while key ta waited with ready task ...``; the soak, two instances, seed 159483, shrunk). A refused
    claim now kicks the lane (``Dispatcher.claim_refused``)."""
    machine = type("TwoInstances", (SimMachine,), {"instances": 2})
    m = machine()
    m.boot(seed=159483, epoch="berlin-fall", skews=(0.0, 0.0, 0.0))
    no_unique = {"ukeys": [None] * 4, "ufor": None}
    try:
        m.holds()
        m.create_batch(
            approvals=[False, True, False, False], ckeys=[None, "ta", None, None], kinds=["echo", "echo", "echo"],
            thread=None, user="alice", **no_unique,
        )  # fmt: skip
        m.claim_all(n=0)
        m.advance(seconds=61.0)
        m.create_thread(user="bob")
        m.create_batch(
            approvals=[False, False, True, True], ckeys=["ta", None, "ta", "ta"], kinds=["echo", "work", "echo"],
            thread=15, user="bob", **no_unique,
        )  # fmt: skip
        m.claim_all(n=0)
        m.advance(seconds=601.0)
        m.claim(again=False, i=0, n=0)
        m.long_pause(at=None, hold=12.0, k=0, seconds=301.0)
        m.holds()
        m.dead_letter_retry(as_owner=False, force=True, i=3)  # the thread's echo task, dead, queued again
        m.claim_all(n=0)
        m.set_kind(
            changes={"paused": False, "rate": None, "concurrency": 0, "key_concurrency": None, "key_rate": None},
            kind="work", via="service",
        )  # fmt: skip
        m.claim_all(n=2)
        m.long_pause(at=None, hold=12.0, k=0, seconds=61.0)
        m.holds()
    finally:
        m.teardown()


def test_a_claim_batched_before_the_cancel_of_its_keys_running_task_is_refused() -> None:
    """On SQLite, a task of key ``ta`` runs (keyConcurrency 1); a user cancels it while its node settles it, and
    another node claims the key's next task in the same instant. The writer took both into one batch, the claim
    first. Its fast path counted the key's running tasks after every write of the batch, the cancel's too, found
    none besides the claim, and committed: in the batch's (the commit's) order, the claim was made while the
    canceled task still ran (``never_over_key_concurrency: task ... of kind echo key ta claimed while 1 ran
    (limit 1)``; the SQLite soak, seed 2944560212, shrunk). A batch in which a task of a limited kind leaves
    running after a claim of that kind now takes the slow path, which counts each claim at its place."""
    machine = type("OnSqlite", (SimMachine,), {"on_sqlite": True})
    m = machine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0), nats_skew=0.0)
    try:
        for _ in range(7):
            m.advance(seconds=0.5)
        m.create_flood(big=2, keys=["ta", "tb", "tc"], kind="echo", user="alice")
        for _ in range(27):
            m.advance(seconds=0.5)
        m.set_kind(changes={"paused": False, "key_rate": None, "key_concurrency": 1}, kind="echo", via="service")
        m.advance(seconds=0.5)
        m.claim(again="no", i=0, n=0)
        m.claim_all(n=0)
        m.cancel_while_settling(i=0, n=0, outcome="succeeded")
        m.holds()
        m.advance(seconds=0.5)
        m.holds()
    finally:
        m.teardown()
