"""A task that a schedule launched, and its retries (issue 49 point 10, CONTRACT 2.7, docs/SCHEDULES.md, Retrying a
run's task). Over HTTP on an in-process gateway (real nats-server, real SQLite file, the real dead-letter keeper):

- it is never redriven automatically: its dead letter is kept (and archived later, as an exhausted one), while a
  plain task with the same letter is redriven by the same keeper;
- a retry, a dead-letter retry or a force-retry of it answers 409 RUN_IN_PROGRESS while the schedule has another
  active run, and changes nothing;
- otherwise its run becomes active again: one run at a time (a trigger is refused) and ``max_concurrent_runs``
  hold (a due cron of another schedule waits), and the task's end records the run's status again: a once that
  was ``failed`` becomes ``completed`` when its retried task succeeds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from scheduler_gateway.actors.dead_letter_keeper import DeadLetterPolicy
from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.actors.scheduling.requeue import REOPEN_GRACE_S
from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import Api, HandNode, api_client, running_gateway, wait_for
from .test_dead_letters import letter_of, run_and_fail
from .test_schedules_http import body, soon

FAIL_TEMPLATE = {"kind": "fail", "maxAttempts": 1}


async def _schedule(api: Api, schedule: dict[str, Any] | None = None) -> dict[str, Any]:
    status, s, _ = await api.call("POST", "/api/scheduled-tasks", body(schedule, task=FAIL_TEMPLATE))
    assert status == 201, s
    return s  # type: ignore[no-any-return]


async def _runs(api: Api, s: dict[str, Any]) -> list[dict[str, Any]]:
    return (await api.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]  # type: ignore[no-any-return]


async def _run_ended(api: Api, s: dict[str, Any], index: int, status: str) -> dict[str, Any]:
    async def ended() -> Any:
        runs = await _runs(api, s)
        return runs[index] if len(runs) > index and runs[index]["status"] == status else None

    return await wait_for(ended)  # type: ignore[no-any-return]


async def test_never_redriven_automatically(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    keeper = DeadLetterPolicy(auto_redrive=True, redrive_delay_s=0.1, archive_after_s=3600, sweep_interval_s=0.05)
    sched = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=sched, dead_letters=keeper) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                s = await _schedule(api)
                status, run, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
                assert status == 200
                assert (await run_and_fail(api, node, run["taskId"]))["state"] == "dead"
                # the control: a plain task dead the same way, redriven by the same keeper
                plain = await api.create(FAIL_TEMPLATE)
                await run_and_fail(api, node, plain["id"])
                await api.wait_state(plain["id"], {"queued"}, timeout_s=10)
                sweeps = gw.dead_letter_keeper.sweeps
                await wait_for(lambda: _after(gw.dead_letter_keeper.sweeps, sweeps + 5))
                assert (await api.task(run["taskId"]))["state"] == "dead"
                letter = await letter_of(api, run["taskId"])
                assert (letter["retryCount"], letter["exhausted"], letter["archived"]) == (0, False, False)
                assert [h["action"] for h in await api.history(run["taskId"])].count("redrive") == 0
                assert (await _run_ended(api, s, 0, "failed"))["taskId"] == run["taskId"]
        finally:
            await node.close()


async def test_its_letter_is_archived_as_an_exhausted_one(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    keeper = DeadLetterPolicy(auto_redrive=True, redrive_delay_s=0.05, archive_after_s=0.3, sweep_interval_s=0.05)
    sched = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=sched, dead_letters=keeper) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                s = await _schedule(api)
                run = (await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger"))[1]
                await run_and_fail(api, node, run["taskId"])

                async def archived() -> Any:
                    items = (await api.call("GET", f"/api/deadletter?originalTaskId={run['taskId']}&archived=true"))[1]
                    return items["items"]

                (letter,) = await wait_for(archived)
                assert (letter["retryCount"], letter["exhausted"]) == (0, False)
                assert (await api.task(run["taskId"]))["state"] == "dead"  # archived, never redriven
        finally:
            await node.close()


async def _after(value: int, target: int) -> bool:
    return value >= target


async def test_a_retry_while_the_schedule_has_an_active_run_is_refused(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    no_auto = DeadLetterPolicy(auto_redrive=False, sweep_interval_s=0.1)
    sched = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1)
    async with running_gateway(
        tmp_path / "gw", fresh_nats.url, scheduler=sched, dead_letters=no_auto, policy=TaskPolicy(max_dead_retries=1)
    ) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                s = await _schedule(api)
                first = (await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger"))[1]
                await run_and_fail(api, node, first["taskId"])
                await _run_ended(api, s, 0, "failed")
                status, second, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
                assert status == 200 and second["status"] == "running"  # the schedule's active run
                letter = await letter_of(api, first["taskId"])
                for path, payload in (
                    (f"/api/tasks/{first['taskId']}/retry", None),
                    (f"/api/deadletter/{letter['deadLetterId']}/retry", None),
                    (f"/api/deadletter/{letter['deadLetterId']}/force-retry", {"reason": "now"}),
                ):
                    status, err, _ = await api.call("POST", path, payload)
                    assert status == 409, (path, status)
                    assert err["error"]["code"] == "RUN_IN_PROGRESS", path
                assert (await api.task(first["taskId"]))["state"] == "dead"
                assert (await letter_of(api, first["taskId"]))["retryCount"] == 0
                runs = await _runs(api, s)
                assert [(r["id"], r["status"]) for r in runs] == [(first["id"], "failed"), (second["id"], "running")]
                status, audit, _ = await api.call("GET", f"/api/audit?objectId={first['taskId']}")
                refused = [(a["action"], a["errorCode"]) for a in audit["items"] if a["result"] == "refused"]
                assert refused == [
                    ("retry", "RUN_IN_PROGRESS"),
                    ("redrive", "RUN_IN_PROGRESS"),
                    ("force_retry", "RUN_IN_PROGRESS"),
                ]
        finally:
            await node.close()


async def test_a_retry_makes_the_run_active_again_and_its_end_decides_the_once(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    no_auto = DeadLetterPolicy(auto_redrive=False, sweep_interval_s=0.1)
    sched = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1, max_concurrent_runs=1)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=sched, dead_letters=no_auto) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                once = await _schedule(api, {"type": "once", "runAt": soon(0.3)})
                (run,) = [await _run_ended(api, once, 0, "running")]
                await run_and_fail(api, node, run["taskId"])
                failed = await _run_ended(api, once, 0, "failed")
                got = (await api.call("GET", f"/api/scheduled-tasks/{once['id']}"))[1]
                assert (got["status"], got["lastError"]["code"]) == ("failed", "HANDLER_ERROR")
                # the retry: its run is active again (no end, no error)
                status, retried, _ = await api.call("POST", f"/api/tasks/{run['taskId']}/retry")
                assert status == 200 and retried["state"] == "queued"
                (again,) = await _runs(api, once)
                assert (again["id"], again["status"], again["finishedAt"], again["error"]) == (
                    failed["id"],
                    "running",
                    None,
                    None,
                )
                # one run at a time: a trigger is refused; the budget (1) is taken: another schedule's due cron waits
                status, err, _ = await api.call("POST", f"/api/scheduled-tasks/{once['id']}/trigger")
                assert (status, err["error"]["code"]) == (409, "RUN_IN_PROGRESS")
                other = await _schedule(api, {"type": "once", "runAt": soon(0.1)})
                rounds = gw.scheduling.actor.rounds
                await wait_for(lambda: _after(gw.scheduling.actor.rounds, rounds + 5))
                assert await _runs(api, other) == []  # due, and waiting for budget
                # the retried task succeeds: the run and the once end as it does
                offers = await node.pull("fail")
                (offer, msg), *_ = offers
                assert offer.task_id == run["taskId"]
                reply = await node.claim(offer.task_id, offer.attempt_id)
                await msg.ack()
                await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "", "succeeded", {"ok": True})
                done = await _run_ended(api, once, 0, "succeeded")
                assert done["id"] == run["id"] and done["error"] is None
                got = (await api.call("GET", f"/api/scheduled-tasks/{once['id']}"))[1]
                assert (got["status"], got["lastRunStatus"], got["lastError"]) == ("completed", "succeeded", None)
        finally:
            await node.close()


async def test_a_reopen_whose_requeue_never_came_is_closed_by_the_sweep_after_the_grace(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    """The gateway died between reopening the run and committing the requeue: the run is active, its task still
    ended. The run sweep leaves it for REOPEN_GRACE_S (the commit may still come), then closes it with the task's
    end; the schedule's budget and one-run rule are free again."""
    no_auto = DeadLetterPolicy(auto_redrive=False, sweep_interval_s=0.1)
    sched = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=sched, dead_letters=no_auto) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                s = await _schedule(api)
                run = (await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger"))[1]
                await run_and_fail(api, node, run["taskId"])
                await _run_ended(api, s, 0, "failed")
                now = time.time()
                assert (
                    await gw.store.schedules.reopen_run(run["id"], run["taskId"], now) is not None
                )  # and then the crash
                service = gw.scheduling.service
                assert await service.close_finished_runs(now + REOPEN_GRACE_S - 1) == 0
                assert (await _runs(api, s))[0]["status"] == "running"
                assert await service.close_finished_runs(now + REOPEN_GRACE_S + 1) == 1
                (closed,) = await _runs(api, s)
                assert (closed["status"], closed["error"]["code"]) == ("failed", "HANDLER_ERROR")
                assert (await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger"))[0] == 200
        finally:
            await node.close()
