"""Two instances on one real PostgreSQL, operations drawn at random and routed to either, pauses that make
read-modify-write races interleave, the invariants after every step (tests/pg_random/driver.py, checks.py).

- default: one fixed seed (``SIM_PG_SEED`` to choose another), ``SIM_PG_STEPS`` steps; ``SIM_PG_LEAVE_OUT``
  names operations never to draw (comma-separated, e.g. ``kind_put,pause,resume`` to look past a kinds defect);
- ``make soak`` (``-m slow``): fresh seeds for ``SIM_PG_SOAK_SECONDS`` (default 300);
- a failure prints the seed, the violations and the steps that touched the objects they name.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.pg_cluster import PgCluster

from .driver import describe_counts, run_seed

DEFAULT_SEED = 20_261_207
DEFAULT_STEPS = 700


async def test_two_instances_on_postgres(pg_url: str) -> None:
    seed = int(os.environ.get("SIM_PG_SEED", DEFAULT_SEED))
    steps = int(os.environ.get("SIM_PG_STEPS", DEFAULT_STEPS))
    started = time.perf_counter()
    leave_out = frozenset(n for n in os.environ.get("SIM_PG_LEAVE_OUT", "").split(",") if n)
    counts = await run_seed(pg_url, seed, steps, leave_out)
    print(f"\npg_random seed {seed}: {steps} steps in {time.perf_counter() - started:.1f} s; {describe_counts(counts)}")
    assert sum(counts[m] for m in ("solo", "together", "freeze", "lock")) == steps


@pytest.mark.slow
@pytest.mark.timeout(0)
async def test_two_instances_on_postgres_soak(pg_cluster: PgCluster) -> None:
    """Fresh seeds, each on an emptied database, until the time is up; a failure names its seed."""
    deadline = time.monotonic() + float(os.environ.get("SIM_PG_SOAK_SECONDS", 300))
    runs = 0
    while time.monotonic() < deadline:
        seed = random.SystemRandom().randrange(2**32)
        print(f"pg_random soak: seed {seed}")
        await run_seed(pg_cluster.empty_database(), seed, int(os.environ.get("SIM_PG_STEPS", DEFAULT_STEPS)))
        runs += 1
    print(f"pg_random soak: {runs} seeds")
