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
