"""The deterministic simulation of the core (docs/INVARIANTS.md): hypothesis stateful testing over user
actions, node messages, clock jumps and crash-restarts, every invariant checked after every step.

- default run: a fixed seed (``SIM_SEED`` to choose another), ``SIM_EXAMPLES`` examples of up to
  ``SIM_STEPS`` steps each; at least 20 000 steps within the per-test timeout;
- ``make soak`` (``-m slow``): fresh seeds for ``SIM_SOAK_SECONDS`` (default 600), one instance, two, and one on
  SQLite in turn;
- a failure prints the violated invariants, the seed to replay with (``SIM_SEED=<n>``), and the shrunk steps.
"""

from __future__ import annotations

import logging
import os
import random
import time

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.internal.conjecture import engine as hypothesis_engine
from hypothesis.stateful import run_state_machine_as_test

from .machine import COVERAGE, STATS, SimMachine
from .sim_world import BUS_COUNTS, Freezer
from .workflow_share import STORIES_EVERYWHERE, WorkflowShare, missing_kinds

DEFAULT_SEED = 20_260_308
MIN_STEPS = 20_000


def _settings(examples: int, steps: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        print_blob=True,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )


def run_simulation(
    seed: int, examples: int, steps: int, shrink_s: float, *, on_sqlite: bool = False, instances: int = 1
) -> dict[str, int]:
    """Run the machine under ``seed``; returns the step counts (raises with the shrunk steps on a failure)."""
    for key in STATS:
        STATS[key] = 0
    COVERAGE.clear()
    BUS_COUNTS.clear()
    Freezer.taken = 0
    # SQLite: workflows' share of the steps comes from their stories (workflow_share.py); the memory runs keep their
    # rules as they were unless asked (SIM_WORKFLOW_STORIES=1): another rule changes every example hypothesis draws
    bases = (WorkflowShare, SimMachine) if on_sqlite or STORIES_EVERYWHERE else (SimMachine,)
    machine = type("SimMachineSeeded", bases, {"on_sqlite": on_sqlite, "instances": instances})
    hypothesis_seed(seed)(machine)
    saved = hypothesis_engine.MAX_SHRINKING_SECONDS
    hypothesis_engine.MAX_SHRINKING_SECONDS = int(shrink_s)
    quiet = logging.getLogger("scheduler_gateway")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # injected faults and crashes log by the thousand; the invariants judge
    started = time.perf_counter()
    try:
        run_state_machine_as_test(machine, settings=_settings(examples, steps))
    except BaseException as exc:
        exc.add_note(
            f"simulation: hypothesis seed {seed} (replay: SIM_SEED={seed} pytest tests/simulation "
            f"-k {'sqlite' if on_sqlite else 'several' if instances > 1 else 'default'}); "
            f"{STATS['steps']} steps, {STATS['examples']} examples, {STATS['crashes']} crashes before it"
        )
        raise
    finally:
        hypothesis_engine.MAX_SHRINKING_SECONDS = saved
        quiet.setLevel(level)
        elapsed = time.perf_counter() - started
        if Freezer.taken:
            COVERAGE["pauses taken"] = Freezer.taken
        print(
            f"\nsimulation{' on sqlite' if on_sqlite else ''}{f' x{instances}' if instances > 1 else ''} seed {seed}: "
            f"{STATS['steps']} steps in "
            f"{STATS['examples']} examples, "
            f"{STATS['crashes']} crash-restarts, {elapsed:.1f} s ({STATS['steps'] / max(elapsed, 1e-9):.0f} steps/s); "
            + ", ".join(f"{k} {n}" for k, n in sorted((COVERAGE + BUS_COUNTS).items()))
        )
    return dict(STATS)


def test_simulation_default_budget() -> None:
    seed = int(os.environ.get("SIM_SEED", DEFAULT_SEED))
    examples = int(os.environ.get("SIM_EXAMPLES", 420))
    steps = int(os.environ.get("SIM_STEPS", 100))
    stats = run_simulation(seed, examples, steps, shrink_s=float(os.environ.get("SIM_SHRINK_SECONDS", 45)))
    if examples * steps >= MIN_STEPS:
        assert stats["steps"] >= MIN_STEPS, f"explored only {stats['steps']} steps"
    if examples * steps >= MIN_STEPS and STORIES_EVERYWHERE:
        assert not missing_kinds(COVERAGE), f"no workflow operation of these kinds: {missing_kinds(COVERAGE)}"


def test_simulation_on_sqlite() -> None:
    """The same machine on a SqliteStore (a fresh file per example; a crash closes the store and the next
    process opens the file again); a smaller budget: every store call is a real thread round trip."""
    seed = int(os.environ.get("SIM_SEED", DEFAULT_SEED))
    examples = int(os.environ.get("SIM_SQLITE_EXAMPLES", 40))
    steps = int(os.environ.get("SIM_SQLITE_STEPS", 40))
    stats = run_simulation(
        seed, examples, steps, shrink_s=float(os.environ.get("SIM_SHRINK_SECONDS", 45)), on_sqlite=True
    )
    assert stats["examples"] >= min(examples, 10), f"ran only {stats['examples']} examples"
    # the default seed and budget make every kind of workflow operation (a guard against a change that stops the
    # run making one); another seed draws other examples, where a rare kind may be missing by chance: told, not failed
    missed = missing_kinds(COVERAGE)
    if seed == DEFAULT_SEED and examples * steps >= 40 * 40:
        assert not missed, f"no workflow operation of these kinds: {missed}"
    elif missed:
        print(f"simulation on SQLite, seed {seed}: no workflow operation of these kinds: {missed}")


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_simulation_soak() -> None:
    """Fresh seeds until the time is up; each failing seed is printed by ``run_simulation``."""
    deadline = time.monotonic() + float(os.environ.get("SIM_SOAK_SECONDS", 600))
    # one instance, two on one shared store, one on a real SQLite file (its writer's batches are its own code),
    # in turn; SQLite's steps cost several times more, so its examples are fewer and shorter
    modes = (("one instance", 1, False), ("two", 2, False), ("SQLite", 1, True))
    total = dict.fromkeys((name for name, _, _ in modes), 0)
    turn = 0
    while time.monotonic() < deadline:
        name, instances, on_sqlite = modes[turn % len(modes)]
        turn += 1
        seed = random.SystemRandom().randrange(2**32)
        examples, steps = (30, 80) if on_sqlite else (100, 150)
        stats = run_simulation(seed, examples, steps, shrink_s=120, on_sqlite=on_sqlite, instances=instances)
        total[name] += stats["steps"]
    print("soak: " + ", ".join(f"{n} steps with {name}" for name, n in total.items()))
