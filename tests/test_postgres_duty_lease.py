"""The leader lease's row with several instances acquiring it at once (postgres/duties.py; docs/INVARIANTS.md, Rows
with several writers): the read, the decision and the write are one transaction on the row locked ``FOR UPDATE``,
so of many acquirers racing for a free lease exactly one holds it, and a takeover raises the term exactly once."""

from __future__ import annotations

import asyncio

from scheduler_gateway.daemon.store.postgres import PostgresStore


async def test_of_instances_racing_for_a_lease_one_holds_it_and_a_takeover_is_one_term(
    two_pg_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_pg_stores
    duty = "race-test"
    got = await asyncio.gather(*((a if n % 2 else b).duties.acquire_duty(duty, f"inst-{n}", 30.0) for n in range(12)))
    winners = [n for n, acquired in enumerate(got) if acquired is not None]
    assert len(winners) == 1
    holder, term, _ = (await a.duties.duty_holders())[duty]
    assert (holder, term) == (f"inst-{winners[0]}", got[winners[0]].term)  # type: ignore[union-attr]
    # the holder lets it go; the next race takes it over once, one term up
    await b.duties.release_duty(duty, holder, term)
    again = await asyncio.gather(*((a if n % 2 else b).duties.acquire_duty(duty, f"next-{n}", 30.0) for n in range(12)))
    taken = [x for x in again if x is not None]
    assert len(taken) == 1 and taken[0].term == term + 1 and taken[0].previous_holder == holder
    # a release naming an old term changes nothing
    await a.duties.release_duty(duty, holder, term)
    assert (await b.duties.duty_holders())[duty][:2] == (next(f"next-{n}" for n, x in enumerate(again) if x), term + 1)
