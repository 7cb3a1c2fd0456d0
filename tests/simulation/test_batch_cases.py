"""Cases of batch creates replayed step by step on the simulation's machine: each failed before the fix named in
its docstring."""

from __future__ import annotations

from .machine import SimMachine


def test_a_batch_item_refused_for_its_key_does_not_hold_back_the_items_committed_with_it() -> None:
    """On SQLite a batch's second item commits while its first is refused for a key already used (another body).
    The refused item's key record was read (an await) before the committed item was made live, so for that read
    a queued task sat in the store unknown to the dispatcher, and the step, cut while the read was under way,
    found it so (the SQLite soak's ``live_state_matches_store``, seed 519263489, shrunk). Every committed item is
    now made live before any refused item's record is read."""
    machine = type("OnSqlite", (SimMachine,), {"on_sqlite": True})
    m = machine()
    m.boot(skews=(0.0, 0.0, 0.0), epoch="berlin-fall", seed=0, nats_skew=0.0)
    try:
        m.create_batch(approvals=[False] * 4, ckeys=[None] * 4, idem=[None, "k1", None, None],
                       kinds=["echo", "echo"], thread=None, ufor=None, ukeys=[None] * 4, user="alice")  # fmt: skip
        m.holds()
        m.advance(seconds=0.5)
        m.holds()
        m.create_batch(approvals=[False] * 4, ckeys=[None] * 4, idem=["k1", None, None, None],
                       kinds=["echo", "echo"], thread=None, ufor=None, ukeys=[None] * 4, user="alice")  # fmt: skip
        m.holds()
    finally:
        m.teardown()
