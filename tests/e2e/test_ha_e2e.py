"""Several real ``gatewayd run`` processes on one PostgreSQL database and one external nats-server, with a real
``gateway-worker`` (issue 13, docs/OPERATIONS.md): the leader is killed with SIGKILL while tasks run; another
instance holds the leader lease within 15 s, every task finishes ``succeeded`` exactly once, the event
sequence keeps growing and the surviving instances answer the API.

The default leader lease (10 s, renewed every 3 s) is not a config key: the takeover takes 7-11 s here. A
settle the killed instance had pulled from ``GW_SETTLE`` and not acked comes back after the consumer's ack
wait (30 s), which equals the default task lease: when that lease ran out first, the task ran a second time
and its late settle is refused (``settle_superseded``); the task still succeeds exactly once, in ~40 s."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from tests.integration.harness import Api
from tests.integration.sse import Frame, sse

from . import invariants_api as inv
from .procs import BIN, Daemon, Worker

NAMES = ("gw-a", "gw-b", "gw-c")
TAKEOVER_BOUND_S = 15.0


@pytest.fixture
def instances(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> Iterator[dict[str, Daemon]]:
    daemons: dict[str, Daemon] = {}
    try:
        for name in NAMES:  # one after the other: the first one migrates the fresh database
            d = Daemon(
                data_dir=tmp_path / name / "var",
                nats_url=fresh_nats.url,
                extra_env={"GW_STORE_URL": pg_fresh_url, "GW_INSTANCE_ID": name},
            )
            (tmp_path / name).mkdir()
            daemons[name] = d
            d.start()
        yield daemons
    finally:
        for d in daemons.values():
            d.stop()


@pytest.fixture
def worker(tmp_path: Path, fresh_nats: NatsServerProcess, instances: dict[str, Daemon]) -> Iterator[Worker]:
    (tmp_path / "worker").mkdir()
    w = Worker(tmp_path / "worker" / "var", "node-ha", kinds="echo,sleep", concurrency=8, nats_url=fresh_nats.url)
    w.start()
    try:
        yield w
    finally:
        w.kill9()  # a graceful stop would wait for its sleeping handlers


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


def lease_holder(store_url: str) -> tuple[str, int] | None:
    """The leader lease's live holder and term in ``duty_leases`` (by the database's clock), or None."""
    with psycopg.connect(store_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT holder, term FROM duty_leases WHERE duty = 'leader'"
            " AND expires_at > extract(epoch from clock_timestamp())::double precision"
        ).fetchone()
    return (str(row[0]), int(row[1])) if row and row[0] else None


async def wait_holder(store_url: str, timeout_s: float, not_: str | None = None) -> tuple[str, int]:
    async def held() -> tuple[str, int] | None:
        got = await asyncio.to_thread(lease_holder, store_url)
        return got if got is not None and got[0] != not_ else None

    return await inv.poll("no live leader lease", held, timeout_s, every_s=0.1)


async def metrics(api: Api) -> str:
    async with api.session.get(api.base + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


async def event_seqs(api: Api) -> list[int]:
    """Every event the instance replays from the start of the stream, in the order it sends them."""
    async with sse(api, last_event_id=0) as stream:
        frames: list[Frame] = await stream.quiet(1.5)
    return [f.seq for f in frames if f.id is not None]


def settle_superseded(task_id: str, history: list[dict[str, Any]], settles: list[dict[str, Any]]) -> bool:
    """The settle audit of a task that succeeded once: exactly one settle applied (``ok``), the one in its history.
    A settle the killed instance had pulled from JetStream and never acked is redelivered after the consumer's
    ack wait (``SETTLE_ACK_WAIT_S``). Two outcomes are allowed for such a copy. If the killed instance had
    committed it, the copy is answered ``repeat`` under the applied settle's own attempt and lease, changing
    nothing. If the attempt's lease ran out first, the lease clock finds the settle waiting in GW_SETTLE and
    applies it, and the copy is again a repeat; only a settle stored after its lease's expiry committed finds
    the attempt failed and the task run again, and is refused ``LEASE_EXPIRED``, but only for an earlier attempt
    that the history shows failed, never for the applied settle's own lease. True when a refused copy was seen."""
    applied = [e for e in settles if e["result"] == "ok"]
    assert len(applied) == 1, f"{task_id}: settle audit {settles}"
    (settle,) = [h for h in history if h["action"] == "settle"]
    assert applied[0]["attemptId"] == settle["attemptId"], f"{task_id}: {settles} vs {history}"
    for e in settles:
        if e["result"] == "repeat":
            assert e["attemptId"] == settle["attemptId"], f"{task_id}: a repeat of another attempt: {e}"
            assert e["details"]["leaseId"] == settle["leaseId"], f"{task_id}: a repeat under another lease: {e}"
            assert e["newRevision"] is None, f"{task_id}: a repeat that changed the task: {e}"
    late = [e for e in settles if e["result"] not in ("ok", "repeat")]
    expired = {h["revision"] - 1 for h in history if h["action"] == "attempt_failed" and h["reason"] == "LEASE_EXPIRED"}
    expired_leases = {h["leaseId"] for h in history if h["action"] == "claim" and h["revision"] in expired}
    for e in late:
        assert e["result"] == "refused" and e["errorCode"] == "LEASE_EXPIRED", f"{task_id}: {e}"
        assert e["details"]["leaseId"] != settle["leaseId"], f"{task_id}: a copy of the applied settle refused: {e}"
        assert e["details"]["leaseId"] in expired_leases, f"{task_id}: {e} names no expired lease: {history}"
    return bool(late)


async def test_a_killed_leader_is_replaced_within_15_s_and_its_tasks_finish_once(
    instances: dict[str, Daemon], worker: Worker, session: aiohttp.ClientSession, pg_fresh_url: str
) -> None:
    apis = {name: Api(session, d.base, d.token) for name, d in instances.items()}
    leader, term = await wait_holder(pg_fresh_url, 15.0)
    assert 'gw_duty_held{duty="leader"} 1.0' in await metrics(apis[leader])

    # tasks through every instance, the leader's too: sleeps of 1-2 s, and some with a 2 s lease that only
    # heartbeats keep alive across the takeover
    made: list[dict[str, object]] = []
    names = itertools.cycle(NAMES)
    for i in range(20):
        made.append(await apis[next(names)].create({"kind": "sleep", "payload": {"seconds": 1 + (i % 3) / 2}}))
    for _ in range(4):
        made.append(await apis[next(names)].create({"kind": "sleep", "payload": {"seconds": 3}, "leaseSeconds": 2}))
    ids = [str(t["id"]) for t in made]
    await apis[leader].wait_state(ids[0], {"running", "succeeded"}, timeout_s=15)
    seqs_before = await event_seqs(apis[leader])
    assert seqs_before, "no event before the kill"

    victim = instances[leader]
    assert victim.proc is not None
    pid = victim.proc.pid
    killed_at = time.monotonic()
    os.kill(pid, 9)
    victim.proc.wait(5)
    victim.proc = None
    new_leader, new_term = await wait_holder(pg_fresh_url, TAKEOVER_BOUND_S + 1, not_=leader)
    takeover_s = time.monotonic() - killed_at
    print(
        f"\nleader {leader} (pid {pid}, term {term}) killed; "
        f"{new_leader} holds term {new_term} after {takeover_s:.2f} s"
    )
    assert takeover_s <= TAKEOVER_BOUND_S, f"takeover took {takeover_s:.2f} s"
    assert new_leader in NAMES and new_term > term
    survivors = {n: a for n, a in apis.items() if n != leader}

    # every task ends succeeded once: one terminal transition, revisions +1, one claim per attempt, one settle
    api = survivors[new_leader]
    await inv.wait_terminal(api, ids, timeout_s=45)
    finished, reruns = [], []
    for tid in ids:
        task = await inv.check_task(api, tid, expected="succeeded")
        history = await api.history(tid)
        assert [h["action"] for h in history].count("settle") == 1, f"{tid}: {history}"
        if settle_superseded(tid, history, await inv.audit(api, tid, "settle")):
            reruns.append(tid)
        finished.append(task)
    print(
        f"{len(reruns)} task(s) ran twice: a settle the killed instance had pulled came back after its lease: {reruns}"
    )
    await asyncio.gather(*(inv.assert_stays(api, t, 2.0) for t in finished))

    # the surviving instances answer the API and run new work; the event sequence keeps growing
    for name, a in survivors.items():
        async with session.get(a.base + "/readyz") as resp:
            assert resp.status == 200, (name, await resp.text())
        echo = await a.create({"kind": "echo", "payload": {"from": name}})
        await a.wait_state(echo["id"], {"succeeded"}, timeout_s=15)
        await inv.check_task(a, echo["id"], expected="succeeded")
    for name, a in survivors.items():
        seqs = await event_seqs(a)
        assert seqs == sorted(set(seqs)), f"{name}: event seqs not strictly increasing: {seqs}"
        assert seqs[-1] > seqs_before[-1], f"{name}: no event after the kill ({seqs[-1]} <= {seqs_before[-1]})"
    assert 'gw_duty_held{duty="leader"} 1.0' in await metrics(api)
    for name, a in survivors.items():
        if name != new_leader:
            assert 'gw_duty_held{duty="leader"} 1.0' not in await metrics(a), name

    check = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "gatewayd"), "check"],
        env={**os.environ, "GW_STORE_URL": pg_fresh_url, "GW_DATA_DIR": str(instances[new_leader].data_dir)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    print(check.stdout)
    assert f"{new_leader} (leader, term {new_term})" in check.stdout, check.stdout
