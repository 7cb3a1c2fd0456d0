"""Cases of the event invariants replayed step by step on the simulation's machine: each failed before the fix
named in its docstring."""

from __future__ import annotations

from typing import Any

from .machine import SimMachine


def _down_past_the_window_after_a_foreign_message(m: SimMachine, intrusions: int, nats_skew: float) -> list[Any]:
    """A round's first event stored, then another publisher's message (with no msg id for ``intrusions`` 0, a
    msg id of its own for 1, an event-shaped one for 2), then the process dies right after that publish and
    stays down past the stream's duplicate window: the stream once the relay is back."""
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0), nats_skew=nats_skew)
    m.holds()
    assert m.sim is not None
    m.sim.bus.intrusions = intrusions
    m.chaos(k=1, what="intrude")  # just before the next round's second event
    m.chaos(k=1, what="outage")  # that publish's process dies right after it, down past the window
    m.create_flood(big=2, keys=["ta", "tb", "tc"], kind="echo", user="alice")
    m.holds()
    m.advance(seconds=61.0)
    m.holds()
    return list(m.sim.bus.events)


def test_a_foreign_message_inside_a_round_acked_by_its_last_loses_no_event() -> None:
    """Another publisher's message is stored just before the second event of a round that asks one ack, its
    last's. Chained by sequences alone, the foreign message stood in for the refused event: the events after it
    fitted the sequences they expected, the last ack vouched for the round, and the relay deleted an event it had
    never published (``every_change_has_its_event: task ... r1 (create): its event is neither in the stream nor in
    the outbox``). Each event after a round's first now also names the one before it (the NATS bus's
    ``_send_chain``, the simulation's bus in step), so the round is refused from there and relayed again."""
    m = SimMachine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0))
    try:
        m.holds()
        m.chaos(k=1, what="intrude")
        m.holds()
        m.create_flood(big=2, keys=["ta", "tb", "tc"], kind="echo", user="alice")
        m.holds()
        assert m.sim is not None
        stream = m.sim.bus.events
        assert [e.msg_id for e in stream].count("") == 1 and len(stream) > 2  # the foreign one, inside a round
    finally:
        m.teardown()


def test_a_publish_lost_with_a_foreign_message_in_its_place_loses_no_event() -> None:
    """A round's first event is lost on the way and another publisher's message is stored where it would have
    gone. Items chained by sequences took the foreign message for the lost event, even acked one by one: the
    rest were stored, the relay read the tail, took every row up to its newest event as published and deleted
    the lost one (the soak's ``every_change_has_its_event ... r1 (create)``, after ``chaos(lose)`` and
    ``chaos(intrude)``). Every item after the first now names the one before it, in both ways of publishing."""
    m = SimMachine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0))
    try:
        m.holds()
        m.chaos(k=4, what="lose")  # the next round's first event
        m.chaos(k=1, what="intrude")  # a foreign message just before its second
        m.create_flood(big=2, keys=["ta", "tb", "tc"], kind="echo", user="alice")
        m.holds()
        m.advance(seconds=2.0)  # the relay's backoff after the failed round
        m.holds()
        assert m.sim is not None and m.sim.bus.lose_event_at is None and m.sim.bus.intrude_at is None
        assert m.view.outbox_size() == 0
    finally:
        m.teardown()


def test_a_step_cut_before_its_advance_expects_nothing_of_the_time_it_did_not_pass() -> None:
    """``chaos(cut)`` with k = 1 cuts the next step at its first turn: an ``advance`` of 4 hours ends before its
    clock moves, and the restarted process has had no time to finish the delete its predecessor left. The
    liveness checks took the step's requested advance for time passed (``events_reach_the_stream: the outbox
    kept events after time passed``, on SQLite, at t = 5 s). A cut step now counts as no time passed."""
    machine = type("OnSqlite", (SimMachine,), {"on_sqlite": True})
    m = machine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0))
    try:
        m.holds()
        m.advance(seconds=1.5)
        m.create_batch(
            approvals=[False] * 4, ckeys=[None] * 4, kinds=["echo", "echo"], thread=None, ufor=None,
            ukeys=[None] * 4, user="alice",
        )  # fmt: skip
        m.advance(seconds=3.5)
        m.claim(again=False, i=0, n=0)
        m.chaos(k=1, what="cut")
        m.advance(seconds=14400.0)
        m.holds()
        m.advance(seconds=61.0)  # time passes now: the restarted relay finishes its predecessor's delete
        m.holds()
        assert m.sim is not None and m.sim.now() - m.sim.epoch >= 61.0
    finally:
        m.teardown()


def test_a_relay_down_past_the_duplicate_window_after_a_foreign_message_publishes_nothing_twice() -> None:
    """A round's first event is stored, then another publisher's message with a msg id of its own (the events
    after it are refused), and the process dies before the relay deletes the first event's row; it comes back
    after the stream forgot the event's msg id. Taking the newest message with any msg id for its tail, the
    relay found the foreign one, no row of its own, and published the first event again, stored twice
    (``events_published_once_in_order``). The tail is now the newest *event* id behind any other messages."""
    m = SimMachine()
    try:
        stream = _down_past_the_window_after_a_foreign_message(m, intrusions=1, nats_skew=0.0)
        assert any(e.msg_id.startswith("other-") for e in stream) and m.sim.crashes == 1
    finally:
        m.teardown()


def test_a_foreign_message_with_an_event_shaped_msg_id_does_not_stand_in_for_the_relays_tail() -> None:
    """As the case above, with the foreign message's msg id shaped as an event id. Taking the newest message
    with an event-shaped msg id for its tail, the restarted relay found the foreign one, no row of its own, and
    published the first event again, stored twice (``events_published_once_in_order``). The relay's own messages
    are now those with an event id published chained (a ``Nats-Expected-Last-*`` header, which every relay
    publish carries)."""
    m = SimMachine()
    try:
        stream = _down_past_the_window_after_a_foreign_message(m, intrusions=2, nats_skew=0.0)
        foreign = [e for e in stream if not e.chained]
        assert len(foreign) == 1 and foreign[0].msg_id.startswith("evt_") and m.sim.crashes == 1
    finally:
        m.teardown()


def test_a_relay_far_ahead_of_the_nats_servers_clock_finds_its_tail_behind_a_foreign_message() -> None:
    """As the case above, with the NATS server's clock 15 minutes behind the gateway's (more than the relay's
    ``TAIL_SKEW_S``): the foreign message stored after the round's first event looked older than the oldest
    outbox row less the skew allowed, the look-back stopped at it, and the restarted relay published the first
    event again (``events_published_once_in_order``). The floor is now moved onto the server's clock by the
    offset between the clocks, read when the tail is."""
    m = SimMachine()
    try:
        stream = _down_past_the_window_after_a_foreign_message(m, intrusions=0, nats_skew=-900.0)
        assert [e.msg_id for e in stream].count("") == 1 and m.sim.crashes == 1
    finally:
        m.teardown()
