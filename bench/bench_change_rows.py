"""CPU time of building a task's changes in Python, before any SQL: per create, claim and settle, the state
machine's transition, the task service's change (its audit entry and event, exactly as ``TaskLedger.change``
builds them) and the writer's rows (``ChangeRows.of``, the JSON encodes included).

20,000 tasks with small payloads (``bench_growth``'s helpers); wall time per step on an otherwise idle core.
Compare two versions by running each from its own checkout, alternated:

    .venv/bin/python bench/bench_change_rows.py
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

SELF = Path(__file__).resolve()
for p in (str(SELF.parent), str(SELF.parent.parent / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_growth import _new_task, _Service  # noqa: E402

from scheduler_gateway.actors.model import task_machine as sm  # noqa: E402
from scheduler_gateway.actors.model.records import ActorRef  # noqa: E402
from scheduler_gateway.daemon.store.change_rows import ChangeRows  # noqa: E402


def run(n: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    svc = _Service()
    now = time.time()
    later = now + 100  # every task due by then
    tasks = [_new_task(rng, "alice", "echo", {"i": i}, now + i / 1000) for i in range(n)]
    out: dict[str, float] = {}

    def timed(name: str, step: Callable[[], list[Any]]) -> list[Any]:
        t0 = time.perf_counter()
        result = step()
        out[name] = (time.perf_counter() - t0) / n * 1e6
        return result

    def change_and_rows(what: str, transitions: list[Any]) -> None:
        changes = timed(
            f"{what}: service change", lambda: [svc.change(tr, None, None, None, None) for tr in transitions]
        )
        timed(f"{what}: ChangeRows.of", lambda: [ChangeRows.of(c) for c in changes])

    creates = timed(
        "create: transition", lambda: [sm.create(t, ActorRef("user", t.owner), t.created_at, None) for t in tasks]
    )
    change_and_rows("create", creates)
    claims = timed(
        "claim: transition", lambda: [sm.claim(tr.task, tr.task.attempt_id, "node-a", "lse_x", later) for tr in creates]
    )
    change_and_rows("claim", claims)
    settles = timed(
        "settle: transition",
        lambda: [
            sm.settle(
                c.task, node_id="node-a", lease_id=c.task.lease_id or "", attempt_id=c.task.attempt_id,
                outcome="succeeded", result=msgspec.Raw(b'{"ok":true}'), digest="d", error=None, retryable=False,
                lease_known=True, new_attempt_id="att_x", delay_s=1.0, now=later + 1,
            )
            for c in claims
        ],
    )  # fmt: skip
    change_and_rows("settle", settles)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    figures = run(args.tasks, args.seed)
    for name, us in figures.items():
        print(f"{us:7.2f} us  {name}")
    print(f"{sum(figures.values()):7.2f} us  all three changes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
