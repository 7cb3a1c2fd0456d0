"""Cases of the event invariants replayed step by step on the simulation's machine: each failed before the fix
named in its docstring."""

from __future__ import annotations

from .machine import SimMachine


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
