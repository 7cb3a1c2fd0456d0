"""The deterministic simulation with two gateway instances on one shared store (docs/INVARIANTS.md): the same
machine and ``run_simulation`` as ``test_simulation.py``, in a file of its own so that with ``-n 2 --dist loadfile``
it runs on one worker while the one-instance runs take the other (together they were one 160 s file, started late,
that one worker ran alone at the end)."""

from __future__ import annotations

import os

from .machine import COVERAGE
from .test_simulation import DEFAULT_SEED, MIN_STEPS, run_simulation
from .workflow_share import STORIES_EVERYWHERE, missing_kinds


def test_simulation_several_instances() -> None:
    """Two instances on one shared store, clocks up to ``MAX_SKEW_S`` apart, requests and node messages to
    either, each of them frozen at any IO await for as long as time is advanced, crash-restarted alone."""
    seed = int(os.environ.get("SIM_SEED", DEFAULT_SEED))
    examples = int(os.environ.get("SIM_MULTI_EXAMPLES", 420))
    steps = int(os.environ.get("SIM_MULTI_STEPS", 100))
    stats = run_simulation(seed, examples, steps, shrink_s=float(os.environ.get("SIM_SHRINK_SECONDS", 45)), instances=2)
    assert stats["examples"] >= min(examples, 10), f"ran only {stats['examples']} examples"
    if examples * steps >= MIN_STEPS and STORIES_EVERYWHERE:
        assert not missing_kinds(COVERAGE), f"no workflow operation of these kinds: {missing_kinds(COVERAGE)}"
