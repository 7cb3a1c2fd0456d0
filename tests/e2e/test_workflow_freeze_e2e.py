"""A join's release frozen on one of two instances on PostgreSQL (issue 52, docs/FAILPOINTS.md ``:stop``).

P (armed with ``workflow.release_before_commit:stop``) runs the workflow alone: its releaser reads the join's
notice, decides to release it and freezes (SIGSTOP) before committing, memory and connections intact. Only then
does Q start on the same database and nats-server: the notice is durable and Q's releaser reads it too, releases
the join, and the join runs and the workflow ends, all through Q while P stays frozen. Then SIGCONT: P goes on
from exactly where it stopped and commits its stale release, which the task's compare-and-set must refuse.
The join ran exactly once, after all its parents; no claim of it was granted before its release; it stays
succeeded once P is back (the worker's log and the histories, workflow_checks.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from . import invariants_api as inv
from . import workflow_checks as wf
from .procs import Daemon
from .test_freeze_e2e import Pair, api_of, cont, wait_frozen
from .test_freeze_e2e import pair as pair  # the fixture
from .workflow_handlers import runs

POINT = "workflow.release_before_commit"


async def alive(session: aiohttp.ClientSession, d: Daemon) -> None:
    """``d`` answers /healthz again after its SIGCONT (its readiness may stay down a while: it lost the duties'
    leadership while frozen)."""

    async def up() -> bool:
        async with session.get(d.base + "/healthz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return resp.status == 200

    await inv.poll(f"{d.base} not alive after SIGCONT", up, timeout_s=15)


# (spec, shape): the first release P decides is the fan-in's join; the diamond's d is its third (after b and c).
# The fan-in runs in `make soak`: its join's claim or settle routed to the frozen P waits out the node's claim
# timeout or GW_SETTLE's ack wait (26 s here, alone on the machine); the diamond stays in the default run
CASES = [
    pytest.param(f"{POINT}@3:stop", "diamond", id="diamond"),
    pytest.param(f"{POINT}:stop", "fan_in", id="fan_in", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("spec", "shape"), CASES)
async def test_a_join_release_frozen_on_one_instance_is_made_once_by_the_other(
    pair: Pair, session: aiohttp.ClientSession, tmp_path: Path, spec: str, shape: str
) -> None:
    log = tmp_path / "runs.jsonl"
    pair.start_p(spec)
    (pair.root / "worker").mkdir()
    pair.worker = wf.worker(pair.root / "worker" / "var", log, nats_url=pair.nats_url)
    tasks = wf.diamond() if shape == "diamond" else wf.fan_in(50)
    join = tasks[-1]["ref"]
    created = await wf.submit(api_of(pair.p, session), tasks)
    frozen_at = await wait_frozen(pair.p, POINT)
    parents = {d["ref"] for d in tasks[-1]["dependsOn"]}
    assert parents <= {r["ref"] for r in runs(log)} and join not in {r["ref"] for r in runs(log)}, (
        "scenario: P froze before every parent of the join ran, or after the join ran"
    )

    await asyncio.to_thread(pair.q.start)
    api = api_of(pair.q, session)
    by_ref = await wf.check_workflow(api, created["id"], lambda: runs(log))  # all through Q, P still frozen
    join_task = by_ref[join]

    print(f"\n{shape}: done through Q {time.monotonic() - frozen_at:.1f} s after P froze")
    cont(pair.p)  # P commits the release it decided before the freeze: refused, the join has moved on
    await alive(session, pair.p)
    # its stale commit lost the compare-and-set: its mailbox decides again on the fresh task (nothing to do)
    await inv.assert_stays(api, join_task, 3.0)
    await wf.check_workflow(api, created["id"], lambda: runs(log))
    assert sum(r["ref"] == join for r in runs(log)) == 1
