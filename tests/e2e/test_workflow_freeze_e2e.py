"""A join's release frozen on one of two instances on PostgreSQL (issue 52, docs/FAILPOINTS.md ``:stop``).

P (armed with a ``stop`` failpoint) runs the workflow alone and freezes (SIGSTOP), memory and connections intact,
at one of the release's edges: right after the parent's terminal commit that made the join ready
(``workflow.after_terminal_commit``), after deciding the join's release and before committing it
(``workflow.release_before_commit``), or after committing it and before dropping its notice
(``workflow.release_before_drop``). Only then does Q start on the same database and nats-server: the notice is
durable and Q's releaser reads it too, releases the join (or finds it released), and the join runs and the
workflow ends, all through Q while P stays frozen. Then SIGCONT: P goes on from exactly where it stopped (a stale
release, which the task's compare-and-set must refuse). The join ran exactly once, after all its parents; no
claim of it was granted before its release; it stays succeeded once P is back (the worker's log and the
histories, workflow_checks.py).
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
from .test_freeze_e2e import Pair, api_of, cont, wait_frozen, wait_ready
from .test_freeze_e2e import pair as pair  # the fixture
from .workflow_handlers import runs

RELEASE = "workflow.release_before_commit"
COMMIT = "workflow.after_terminal_commit"
DROP = "workflow.release_before_drop"


async def alive(session: aiohttp.ClientSession, d: Daemon) -> None:
    """``d`` answers /healthz again after its SIGCONT (its readiness comes once it knows it follows)."""

    async def up() -> bool:
        async with session.get(d.base + "/healthz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return resp.status == 200

    await inv.poll(f"{d.base} not alive after SIGCONT", up, timeout_s=15)


# (point, hit, shape): where P freezes. RELEASE: the first release P decides is the fan-in's join, the diamond's
# d its third (after b and c); COMMIT: the terminal commit that makes the join ready (the fan-in's 50th, the
# diamond's third: a, then b and c); DROP: P committed the release and froze before dropping the notice, which Q
# reads again (the join may have been offered before the freeze). The fan-ins run in `make soak`: the join's claim
# or settle routed to the frozen P waits out the node's claim timeout or GW_SETTLE's ack wait (26 s here, alone
# on the machine); the diamonds stay in the default run
CASES = [
    pytest.param(RELEASE, 3, "diamond", id="release-diamond"),
    pytest.param(COMMIT, 3, "diamond", id="commit-diamond"),
    pytest.param(RELEASE, 1, "fan_in", id="release-fan_in", marks=pytest.mark.slow),
    pytest.param(COMMIT, 50, "fan_in", id="commit-fan_in", marks=pytest.mark.slow),
    pytest.param(DROP, 1, "fan_in", id="drop-fan_in", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("point", "hit", "shape"), CASES)
async def test_a_join_release_frozen_on_one_instance_is_made_once_by_the_other(
    pair: Pair, session: aiohttp.ClientSession, tmp_path: Path, point: str, hit: int, shape: str
) -> None:
    log = tmp_path / "runs.jsonl"
    pair.start_p(f"{point}@{hit}:stop")
    (pair.root / "worker").mkdir()
    pair.worker = wf.worker(pair.root / "worker" / "var", log, nats_url=pair.nats_url)
    tasks = wf.diamond() if shape == "diamond" else wf.fan_in(50)
    join = tasks[-1]["ref"]
    created = await wf.submit(api_of(pair.p, session), tasks)
    frozen_at = await wait_frozen(pair.p, point)
    parents = {d["ref"] for d in tasks[-1]["dependsOn"]}
    ran = {r["ref"] for r in runs(log)}
    assert parents <= ran, f"scenario: P froze before every parent of the join ran: {sorted(ran)}"
    assert point == DROP or join not in ran, "scenario: P froze after the join ran"

    await asyncio.to_thread(pair.q.start)
    api = api_of(pair.q, session)
    by_ref = await wf.check_workflow(api, created["id"], lambda: runs(log))  # all through Q, P still frozen
    join_task = by_ref[join]

    print(f"\n{shape}: done through Q {time.monotonic() - frozen_at:.1f} s after P froze")
    # RELEASE: P commits the release it decided before the freeze: it loses the compare-and-set, and its mailbox
    # decides again on the fresh task (nothing to do); COMMIT: P wakes its releaser, whose notice is gone; DROP:
    # P drops notices Q already dropped
    cont(pair.p)
    await alive(session, pair.p)
    await inv.assert_stays(api, join_task, 3.0)
    await wf.check_workflow(api, created["id"], lambda: runs(log))
    assert sum(r["ref"] == join for r in runs(log)) == 1
    await wait_ready(session, pair.p, timeout_s=20)  # a follower now: ready (its relay's trouble went with the duty)
