"""CONTRACT 2.12 rule by rule (issue 52's "Done when"): the rules no other test showed with a real gateway
(on SQLite and on PostgreSQL), a real nats-server and SDK workers. The table of every rule and the tests that
show it is below.

The rules of CONTRACT 2.12 (with its lines in 2.1, 2.6, 3 and 5) and the tests that show them ("here": this
module; other paths from the repository root):

R1  1..10,000 tasks; 0 and 10,001 -> 400 INVALID_ARGUMENT
      tests/integration/test_workflow_http.py:
          test_a_refused_submit_names_its_item_and_creates_nothing[no tasks]
          test_a_cycle_is_named_in_order_and_more_than_10000_tasks_are_refused
      here:
          test_a_workflow_of_exactly_10000_tasks_is_taken
R2  name 1..200, maxParallel >= 1, labels, ref [A-Za-z0-9_.-]{1,64}, on, join, the callback's 2.5 rules
      here:
          test_submit_field_rules_each_refused_400_and_nothing_created
R3  duplicate ref, unknown ref, a parent twice, parentId, an item's own code (413, 404, 409) with details.ref;
    nothing created on any refusal
      tests/integration/test_workflow_http.py:
          test_a_refused_submit_names_its_item_and_creates_nothing (13 cases)
          test_an_items_unique_key_held_by_a_live_task_is_named (was a strict xfail: fixed)
      tests/unit/test_workflow_submit.py:
          test_every_refusal_names_its_item_and_creates_nothing
      tests/test_store_contract_workflows.py:
          test_create_is_all_or_nothing
R4  a cycle -> details.cycle, the refs of one cycle in order
      tests/integration/test_workflow_http.py:
          test_a_cycle_is_named_in_order_and_more_than_10000_tasks_are_refused
      tests/cli/test_gatewayctl_workflows.py:
          test_refusals_and_usage_errors
R5  a body over 64 MiB -> 413; other routes keep their limit
      tests/integration/test_workflow_http.py:
          test_the_submit_reads_up_to_64_mib_while_other_routes_keep_their_limit
R6  the answer: id wfl_, name, state, labels, maxParallel, owner, counts (8 keys with waitingApproval), createdAt,
    updatedAt, finishedAt null while running, tasks [{ref, taskId, state, dependsOn, join}]
      tests/integration/test_workflow_http.py:
          test_a_workflow_and_its_tasks_as_answered
      here:
          test_a_finish_with_a_skipped_compensation_its_answer_events_callback_audit_and_a_rework_retry
          test_max_parallel_holds_with_waiting_for_and_counts_partition_while_running
R7  counts partition the tasks (waiting apart from queued, the skipped inside canceled)
      here:
          partitioned(), checked in every finish and while running
R8  state: succeeded when every task not skipped succeeded, failed otherwise, canceled when canceled
      here:
          test_a_finish_with_a_skipped_compensation_its_answer_events_callback_audit_and_a_rework_retry
          test_on_failed_takes_a_dead_parent_a_redrive_and_a_force_retry_reopen_the_skipped
      tests/integration/test_workflows.py:
          test_a_failure_skips_downstream_a_finalizer_runs_and_a_retry_finishes_it
          test_cancel_reaches_a_running_handler_and_max_parallel_holds
R9  the list: newest first, state/name filters, no tasks; GET /api/tasks?workflowId=
      tests/integration/test_workflow_http.py:
          test_the_list_is_newest_first_with_filters_and_pages
          test_a_workflow_and_its_tasks_as_answered
R10 another user's workflow is 404 WORKFLOW_NOT_FOUND (read, cancel, retry, list, tasks, events)
      tests/integration/test_workflow_http.py:
          test_another_users_workflow_is_not_found_everywhere
          test_a_viewer_reads_and_changes_nothing
          test_workflow_events_pass_the_filters_and_replay
R11 waitingFor dependencies; never offered or claimed early, across restarts, crashes and instances
      tests/integration/test_workflows.py:
          test_a_diamond_and_a_chain_run_in_order_and_no_waiting_task_is_offered
          test_a_release_cut_off_by_a_stop_is_made_at_the_next_start
      tests/integration/test_workflows_ha.py:
          test_the_other_instance_releases_and_the_join_runs_once_after_every_parent
      tests/e2e/:
          test_workflow_failpoints_e2e.py, test_workflow_pg_failpoints_e2e.py, test_workflow_freeze_e2e.py
      tests/test_store_contract_workflows.py:
          test_the_claim_of_a_waiting_task_is_refused_until_its_dependencies_hold
      here:
          test_an_approved_task_still_waits_for_its_parents_and_an_unapproved_one_is_skipped
          test_a_skipped_tasks_own_retry_never_runs_it_while_its_parent_stays_failed
R12 skip: canceled with SKIPPED {ref, taskId} naming the parent, and its cascade
      tests/integration/test_workflow_http.py:
          test_a_skipped_task_shows_the_parent_that_decided_it_and_retry_rules
      here:
          test_a_users_cancel_of_one_task_skips_its_dependents_and_the_workflow_ends
          test_a_task_retry_and_a_rework_of_a_failed_parent_reopen_what_it_skipped
          test_histories_and_events_keep_the_task_tables_actions_a_skip_is_a_cancel
R13 on finished = finalizer; on failed = compensation (a dead parent counts as failed; a succeeded one skips it)
      here:
          test_on_failed_takes_a_dead_parent_a_redrive_and_a_force_retry_reopen_the_skipped
          test_a_finish_with_a_skipped_compensation_its_answer_events_callback_audit_and_a_rework_retry
      tests/integration/test_workflows.py:
          test_a_failure_skips_downstream_a_finalizer_runs_and_a_retry_finishes_it
R14 join any: runs after one parent; a parent still running is seen running with result None; skipped when every
    parent lost
      here:
          test_join_any_sees_a_running_parent_as_running_and_is_skipped_when_every_parent_lost
R15 ctx.dependencies: task_id, state, result, error, artifacts {name, size, sha256, contentType}; every page, within
    the message size limit
      here:
          test_a_dependents_view_of_each_parent_has_every_attribute
      tests/integration/test_workflow_worker.py:
          test_a_joins_handler_reads_its_parents_results_errors_and_artifacts
          test_a_fan_in_of_1000_parents_arrives_whole_through_the_pages
      tests/integration/test_workflow_nats.py:
          test_parents_with_large_results_come_in_pages_that_fit_the_servers_max_payload
R16 add_tasks: 1..1,000, only under the lease, a repeat, IDEMPOTENCY_CONFLICT, a held ref INVALID_ARGUMENT, a cycle
    refused, dependents wait for everything added (recursively) and see it
      here:
          test_add_tasks_from_a_task_outside_a_workflow_or_with_a_parent_id_adds_nothing
          test_an_added_task_on_an_ended_parent_is_decided_at_once_and_the_adders_dependent_sees_it
          test_add_tasks_counts_1_to_1000_and_a_dependent_waits_for_what_the_added_add
      tests/integration/test_workflow_nats.py:
          test_a_running_task_adds_tasks_and_its_dependent_waits_for_all_of_them
          test_a_join_reads_its_parents_in_pages_and_another_nodes_lease_is_refused
      tests/integration/test_workflow_worker.py:
          test_add_tasks_from_a_running_handler_and_a_dependent_sees_everything_added
R17 maxParallel never exceeded, across instances; waitingFor workflow_parallel
      here:
          test_max_parallel_holds_with_waiting_for_and_counts_partition_while_running
      tests/integration/test_workflows.py:
          test_cancel_reaches_a_running_handler_and_max_parallel_holds
      tests/integration/test_workflows_ha.py:
          test_max_parallel_holds_across_two_instances
R18 cancel: a running task's cancel reaches its code; the workflow ends canceled
      tests/integration/test_workflows.py:
          test_cancel_reaches_a_running_handler_and_max_parallel_holds
      here:
          test_cancel_of_an_ended_workflow_is_refused_and_a_second_cancel_is_a_repeat
          test_cancels_at_once_cancel_it_once (found: each was audited and announced)
          test_cancel_and_its_idempotency_key_are_audited_and_the_workflow_ends_canceled
R19 retry: default failed, dead, canceled (the skipped by the cascade); succeeded keep results; named succeeded refs
    reworked with downstream; attemptNo goes on, retry/rework in history; 409 while running or nothing failed
      here:
          test_a_retry_naming_an_unknown_ref_is_refused_and_changes_nothing
          test_a_workflow_retry_over_an_exhausted_letter_is_refused_whole
          test_two_retries_at_once_of_a_failed_workflow_retry_it_once (found: both answered 200)
          test_a_workflow_retry_by_default_runs_its_canceled_dead_and_skipped_tasks_again
          test_a_finish_with_a_skipped_compensation_its_answer_events_callback_audit_and_a_rework_retry
      tests/integration/test_workflows.py:
          test_a_failure_skips_downstream_a_finalizer_runs_and_a_retry_finishes_it
      tests/integration/test_workflow_http.py:
          test_a_skipped_task_shows_the_parent_that_decided_it_and_retry_rules
R20 a task's retry, redrive, force-retry or rework reopens what it skipped; the finished workflow runs again
      here:
          test_a_rework_of_a_succeeded_task_runs_the_finished_workflow_again_and_its_callback_counts
          test_on_failed_takes_a_dead_parent_a_redrive_and_a_force_retry_reopen_the_skipped
          test_a_task_retry_and_a_rework_of_a_failed_parent_reopen_what_it_skipped
R21 audited (objectType workflow); Idempotency-Key on submit, cancel, retry (Idempotent-Replayed: true: found
    missing on cancel/retry)
      here:
          test_concurrent_submits_with_one_key_make_one_workflow
          test_cancel_and_its_idempotency_key_are_audited_and_the_workflow_ends_canceled
          test_a_finish_with_a_skipped_compensation_its_answer_events_callback_audit_and_a_rework_retry
      tests/integration/test_workflow_http.py:
          test_idempotency_repeat_conflict_and_scope
R22 events: workflow.created, workflow.finished {state, counts} at each finish, workflow.canceled, workflow.retried;
    only the owner's
      here:
          the same two tests, and the dead-parent one (three finishes)
      tests/integration/test_workflow_http.py:
          test_workflow_events_pass_the_filters_and_replay
R23 callback: {workflowId, state, counts, finishedAt}, X-Callback-Id <id>:<n> with n counting finishes, signed;
    retried under the same id (2.5)
      here:
          test_a_rework_of_a_succeeded_task_runs_the_finished_workflow_again_and_its_callback_counts
          test_a_finish_with_a_skipped_compensation_its_answer_events_callback_audit_and_a_rework_retry
          test_the_workflow_callback_is_retried_under_the_same_id
R24 the Offer's workflowId and ref (3)
      tests/integration/test_workflow_http.py:
          test_a_skipped_task_shows_the_parent_that_decided_it_and_retry_rules
      tests/integration/test_workflows.py:
          test_a_release_cut_off_by_a_stop_is_made_at_the_next_start
R25 a release costs the same whatever the size (its own edges)
      tests/test_store_contract_workflows.py:
          test_a_fan_in_of_10000_moves_one_counter_row_per_settle
          test_sqlite_the_effect_and_guard_statements_seek_only_their_own_rows
      tests/test_postgres_workflows.py:
          test_the_effect_and_guard_statements_reach_their_rows_by_index
          test_a_batch_of_workflow_settles_costs_two_statements_more_than_without_edges
R26 console: list, graph in state colours, edge labels, waits for, cancel/retry, no inline script (Chromium)
      tests/console/test_console_workflows.py:
          test_a_diamond_workflow_in_the_list_and_the_graph_cancel_and_retry
          test_a_ten_thousand_task_graph_draws_500_boxes_and_links_the_rest
          test_a_hand_made_diamond_is_drawn_fits_both_widths_and_passes_axe
R27 gatewayctl workflows submit FILE|- [--wait: 0 succeeded, 1 otherwise], list, get, cancel, retry --ref
      tests/cli/test_gatewayctl_workflows.py:
          test_submit_wait_exits_0_when_it_succeeded_and_get_shows_the_tasks
          test_submit_wait_exits_1_when_it_failed_and_the_table_names_the_skip
          test_a_waiting_task_says_what_it_waits_for_and_cancel_ends_the_workflow
R28 client submit_workflow, get_workflow (and list, wait, cancel, retry)
      tests/integration/test_workflow_worker.py:
          test_the_clients_workflow_calls_against_the_gateway
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.tasks.api import TaskPolicy
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.workflows import AddTasksRequest
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, TaskContext, TaskFailed, Worker
from scheduler_gateway.worker._workflow import Dependency

from .harness import ALICE_TOKEN, Api, HandNode, api_client, running_gateway, wait_for
from .sse import sse
from .test_callbacks import FAST, receiver, signed_by
from .test_workflow_nats import ask, claimed

pytestmark = [pytest.mark.usefixtures("tasks_dumped_before_the_timeout"), pytest.mark.timeout(120)]

SECRET = "workflow-secret-0123456789-abc"
COUNT_KEYS = {"waiting", "waitingApproval", "queued", "running", "succeeded", "failed", "canceled", "dead"}


class Runs:
    """What the handlers saw, and how each ref behaves: ``fail[ref]`` "failed" (for good) or "dead" (retryable,
    so one attempt makes it dead); ``gate[ref]`` holds the handler until set; ``add[ref]`` the items it adds."""

    def __init__(self) -> None:
        self.starts: dict[str, list[float]] = {}
        self.deps: dict[str, dict[str, tuple[str, Any]]] = {}
        self.fail: dict[str, str] = {}
        self.gate: dict[str, asyncio.Event] = {}
        self.add: dict[str, list[dict[str, Any]]] = {}
        self.artifact: dict[str, bytes] = {}
        self.seen: dict[str, dict[str, Dependency]] = {}

    async def handle(self, ctx: TaskContext, payload: Any) -> Any:
        ref = ctx.ref or ctx.task_id
        self.starts.setdefault(ref, []).append(time.monotonic())
        self.deps[ref] = {r: (d.state, d.result) for r, d in ctx.dependencies.items()}
        self.seen[ref] = dict(ctx.dependencies)
        if ref in self.artifact:
            await ctx.put_artifact(f"{ref}.bin", self.artifact[ref])
        if ref in self.add:
            await ctx.add_tasks(self.add[ref])
        if ref in self.gate:
            await self.gate[ref].wait()
        mode = self.fail.get(ref)
        if mode is not None:
            raise TaskFailed(f"{ref} fails", retryable=mode == "dead")
        return {"ref": ref}

    def ran(self, ref: str) -> int:
        return len(self.starts.get(ref, []))


@pytest.fixture(params=["sqlite", "postgres"])
async def gw(request: pytest.FixtureRequest, tmp_path: Path, fresh_nats: NatsServerProcess) -> AsyncIterator[Gateway]:
    """The rules hold on either store: SQLite, and PostgreSQL (a private cluster, a fresh database)."""
    # one redrive before a letter is exhausted, so one test shows both a redrive and a force-retry
    policy = TaskPolicy(max_dead_retries=1)
    store = {} if request.param == "sqlite" else {"store_url": request.getfixturevalue("pg_fresh_url")}
    async with running_gateway(tmp_path / "gw", fresh_nats.url, policy=policy, callbacks=FAST, **store) as g:
        yield g


@pytest.fixture
async def alice(gw: Gateway) -> AsyncIterator[Api]:
    async with api_client(gw) as client:
        yield client.as_user(ALICE_TOKEN)


@pytest.fixture
async def runs(fresh_nats: NatsServerProcess, gw: Gateway) -> AsyncIterator[Runs]:
    record = Runs()
    reg = HandlerRegistry()
    reg.register("wfc", record.handle)
    w = Worker(NatsOptions(servers=[fresh_nats.url]), node_id="node-wfc", kinds=["wfc"], concurrency=8, registry=reg)
    await w.start()
    try:
        yield record
    finally:
        for gate in record.gate.values():
            gate.set()
        await w.stop(grace_s=5)


def t(ref: str, *parents: str, on: str = "succeeded", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "wfc", "ref": ref, **fields}
    if parents:
        body["dependsOn"] = [{"ref": p, "on": on} for p in parents]
    return body


async def submit(api: Api, tasks: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    status, body, _ = await api.call("POST", "/api/workflows", {"tasks": tasks, **fields})
    assert status == 201, body
    return body  # type: ignore[no-any-return]


async def get(api: Api, workflow_id: str) -> dict[str, Any]:
    status, body, _ = await api.call("GET", f"/api/workflows/{workflow_id}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def finished(api: Api, workflow_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        wf = await get(api, workflow_id)
        return wf if wf["state"] != "running" else None

    return await wait_for(done, timeout_s=timeout_s)  # type: ignore[no-any-return]


def ids_of(wf: dict[str, Any]) -> dict[str, str]:
    return {x["ref"]: x["taskId"] for x in wf["tasks"]}


def partitioned(wf: dict[str, Any]) -> None:
    """counts has every key, partitions the tasks, and says what the tasks say."""
    counts = wf["counts"]
    assert set(counts) == COUNT_KEYS, counts
    assert sum(counts.values()) == len(wf["tasks"]), wf
    by_state: dict[str, int] = {}
    for x in wf["tasks"]:
        by_state[x["state"]] = by_state.get(x["state"], 0) + 1
    assert counts["succeeded"] == by_state.get("succeeded", 0) and counts["canceled"] == by_state.get("canceled", 0)
    assert counts["failed"] == by_state.get("failed", 0) and counts["dead"] == by_state.get("dead", 0)
    assert counts["running"] == by_state.get("running", 0)
    assert counts["waitingApproval"] == by_state.get("waiting_approval", 0)
    assert counts["waiting"] + counts["queued"] == by_state.get("queued", 0)


async def audit_actions(api: Api, object_id: str) -> list[tuple[str, str]]:
    status, page, _ = await api.call("GET", f"/api/audit?objectId={object_id}&limit=100")
    assert status == 200, page
    return [(a["objectType"], a["action"]) for a in page["items"]]


async def workflow_events(api: Api, workflow_id: str, n: int) -> list[Any]:
    async with sse(api, f"aggregateId={workflow_id}", last_event_id=0) as stream:
        frames = await stream.take(n, timeout_s=15, where=lambda f: f.data["aggregateType"] == "workflow")
        assert await stream.quiet(0.3) == []
    return frames


async def test_submit_field_rules_each_refused_400_and_nothing_created(alice: Api) -> None:
    ok = [t("a")]
    for case, body in (
        ("empty name", {"name": "", "tasks": ok}),
        ("long name", {"name": "n" * 201, "tasks": ok}),
        ("maxParallel 0", {"maxParallel": 0, "tasks": ok}),
        ("ref of 65", {"tasks": [t("r" * 65)]}),
        ("empty ref", {"tasks": [t("")]}),
        ("ref with /", {"tasks": [t("a/b")]}),
        ("bad on", {"tasks": [t("a"), {**t("b"), "dependsOn": [{"ref": "a", "on": "maybe"}]}]}),
        ("bad join", {"tasks": [t("a"), t("b", "a", join="some")]}),
        ("self cycle", {"tasks": [t("a", "a")]}),
        ("tasks not a list", {"tasks": {"a": t("a")}}),
        ("callback without a secret", {"callbackUrl": "http://127.0.0.1:9/hook", "tasks": ok}),
        ("callback not http", {"callbackUrl": "ftp://127.0.0.1/x", "callbackSecret": SECRET, "tasks": ok}),
        ("labels not strings", {"labels": {"a": 1}, "tasks": ok}),
    ):
        status, answer, _ = await alice.call("POST", "/api/workflows", body)
        assert status == 400 and answer["error"]["code"] == "INVALID_ARGUMENT", (case, answer)
    status, page, _ = await alice.call("GET", "/api/workflows")
    assert page["items"] == []
    status, tasks, _ = await alice.call("GET", "/api/tasks")
    assert tasks["items"] == []
    # the bounds themselves are taken: a ref of 64 of every allowed character, a name of 200, maxParallel 1
    wf = await submit(alice, [t("A_z.0-" + "r" * 58)], name="n" * 200, maxParallel=1)
    assert wf["tasks"][0]["ref"] == "A_z.0-" + "r" * 58 and wf["maxParallel"] == 1


async def test_a_workflow_of_exactly_10000_tasks_is_taken(alice: Api) -> None:
    wf = await submit(alice, [t(f"t{i}", kind="idle") for i in range(10_000)])
    assert len(wf["tasks"]) == 10_000 and wf["counts"]["queued"] == 10_000
    partitioned(wf)


async def test_a_finish_with_a_skipped_compensation_its_answer_events_callback_audit_and_a_rework_retry(
    gw: Gateway, alice: Api, runs: Runs
) -> None:
    async with receiver() as hook:
        wf = await submit(
            alice,
            [t("a"), t("b", "a"), t("undo", "a", on="failed"), t("fin", "a", on="finished")],
            name="contract",
            labels={"team": "x"},
            callbackUrl=hook.url,
            callbackSecret=SECRET,
        )
        ids = ids_of(wf)
        assert wf["finishedAt"] is None and wf["createdAt"] and wf["updatedAt"]
        done = await finished(alice, wf["id"])
        # every task that was not skipped succeeded: succeeded; the skipped compensation is in counts.canceled
        assert done["state"] == "succeeded", done
        assert done["counts"]["succeeded"] == 3 and done["counts"]["canceled"] == 1
        partitioned(done)
        assert done["finishedAt"] is not None and done["createdAt"] <= done["updatedAt"]
        assert (done["name"], done["labels"], done["owner"], done["maxParallel"]) == (
            "contract",
            {"team": "x"},
            "alice",
            None,
        )
        undo = await alice.task(ids["undo"])
        assert undo["state"] == "canceled" and undo["error"]["code"] == "SKIPPED"
        assert undo["error"]["details"] == {"ref": "a", "taskId": ids["a"]} and runs.ran("undo") == 0
        assert runs.deps["fin"]["a"][0] == "succeeded"
        # the callback of the first finish
        await wait_for(lambda: _got(hook, 1), 15)
        first = hook.got[0]
        assert first.headers["X-Callback-Id"] == f"{wf['id']}:1" and signed_by(SECRET, first)
        assert first.json == {
            "workflowId": wf["id"], "state": "succeeded", "counts": done["counts"], "finishedAt": done["finishedAt"]
        }  # fmt: skip
        # nothing failed: a retry without refs is refused, and changes nothing
        status, answer, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {})
        assert status == 409 and answer["error"]["code"] == "INVALID_STATE_TRANSITION", answer
        assert (await get(alice, wf["id"]))["state"] == "succeeded"
        # a retry naming a succeeded ref reworks it with its downstream; its Idempotency-Key repeats, conflicts
        runs.gate["a"] = asyncio.Event()
        key = {"Idempotency-Key": "retry-1"}
        status, retried, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {"refs": ["a"]}, key)
        assert status == 200 and retried["state"] == "running" and retried["finishedAt"] is None, retried
        status, repeat, headers = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {"refs": ["a"]}, key)
        assert status == 200 and repeat["id"] == wf["id"] and headers["Idempotent-Replayed"] == "true", repeat
        status, other, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {"refs": ["b"]}, key)
        assert status == 409 and other["error"]["code"] == "IDEMPOTENCY_CONFLICT", other
        status, answer, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {"refs": ["a"]})
        assert status == 409 and answer["error"]["code"] == "INVALID_STATE_TRANSITION", answer  # running
        b = await alice.task(ids["b"])
        assert b["state"] == "queued" and b["waitingFor"] == "dependencies"
        runs.gate["a"].set()
        done = await finished(alice, wf["id"])
        assert done["state"] == "succeeded"
        partitioned(done)
        assert runs.ran("a") == 2 and runs.ran("b") == 2 and runs.ran("undo") == 0
        a = await alice.task(ids["a"])
        assert a["attemptNo"] == 2 and (await alice.history(ids["a"]))[-3]["action"] == "rework"
        await wait_for(lambda: _got(hook, 2), 15)
        assert [g.headers["X-Callback-Id"] for g in hook.got] == [f"{wf['id']}:1", f"{wf['id']}:2"]
        assert signed_by(SECRET, hook.got[1]) and hook.got[1].json["state"] == "succeeded"
    frames = await workflow_events(alice, wf["id"], 4)
    assert [f.event for f in frames] == [
        "workflow.created",
        "workflow.finished",
        "workflow.retried",
        "workflow.finished",
    ]
    assert frames[1].data["data"]["state"] == "succeeded" and set(frames[1].data["data"]["counts"]) >= COUNT_KEYS - {
        "waitingApproval"
    }
    assert frames[3].data["data"]["counts"]["succeeded"] == 3
    assert await audit_actions(alice, wf["id"]) == [
        ("workflow", "create"), ("workflow", "finish"), ("workflow", "retry"), ("workflow", "finish")
    ]  # fmt: skip


#: CONTRACT 2.1: the actions a task's history holds
HISTORY_ACTIONS = {
    "create", "approve", "amend", "claim", "settle", "attempt_failed", "cancel", "retry", "redrive", "force_retry",
    "rework",
}  # fmt: skip


async def test_histories_and_events_keep_the_task_tables_actions_a_skip_is_a_cancel(alice: Api, runs: Runs) -> None:
    """A release is no change of the state machine (2.2): a dependent's history is create, claim, settle at
    revisions 1, 2, 3; a skip is the table's cancel (reason SKIPPED) and its event task.canceled."""
    wf = await submit(alice, [t("a"), t("b", "a"), t("undo", "a", on="failed"), t("c", "b")])
    ids = ids_of(wf)
    done = await finished(alice, wf["id"])
    assert done["state"] == "succeeded", done
    for ref in ("a", "b", "c"):
        history = await alice.history(ids[ref])
        assert [(h["action"], h["revision"]) for h in history] == [("create", 1), ("claim", 2), ("settle", 3)], (
            ref, history
        )  # fmt: skip
        assert (await alice.task(ids[ref]))["revision"] == 3
    undo = await alice.history(ids["undo"])
    assert [(h["action"], h["revision"], h["to"]) for h in undo] == [("create", 1, "queued"), ("cancel", 2, "canceled")]
    assert undo[-1]["reason"] == "SKIPPED"
    async with sse(alice, f"aggregateId={ids['undo']}", last_event_id=0) as stream:
        frames = await stream.take(2, timeout_s=15)
        assert await stream.quiet(0.3) == []
    assert [f.event for f in frames] == ["task.created", "task.canceled"]
    assert frames[1].data["data"]["reason"] == "SKIPPED" and frames[1].data["revision"] == 2
    async with sse(alice, f"aggregateId={ids['b']}", last_event_id=0) as stream:
        frames = await stream.take(3, timeout_s=15)
        assert await stream.quiet(0.3) == []
    assert [f.event for f in frames] == ["task.created", "task.claimed", "task.succeeded"]
    for ref in ids:
        assert {h["action"] for h in await alice.history(ids[ref])} <= HISTORY_ACTIONS


async def _got(hook: Any, n: int) -> bool:
    return len(hook.got) >= n


async def test_on_failed_takes_a_dead_parent_a_redrive_and_a_force_retry_reopen_the_skipped(
    alice: Api, runs: Runs
) -> None:
    runs.fail["p"] = "dead"
    wf = await submit(alice, [t("p", maxAttempts=1), t("c", "p"), t("comp", "p", on="failed")])
    ids = ids_of(wf)
    done = await finished(alice, wf["id"])
    assert done["state"] == "failed" and done["counts"]["dead"] == 1, done
    assert {x["ref"]: x["state"] for x in done["tasks"]} == {"p": "dead", "c": "canceled", "comp": "succeeded"}
    partitioned(done)
    assert runs.deps["comp"]["p"][0] == "dead"  # a compensation runs on failure, dead included
    c = await alice.task(ids["c"])
    assert c["error"]["code"] == "SKIPPED" and c["error"]["details"] == {"ref": "p", "taskId": ids["p"]}
    status, letters, _ = await alice.call("GET", f"/api/deadletter?originalTaskId={ids['p']}")
    assert status == 200 and len(letters["items"]) == 1, letters
    letter = letters["items"][0]["deadLetterId"]
    # a redrive of the parent: the finished workflow runs again and the skipped child waits again
    runs.gate["p"] = asyncio.Event()
    status, answer, _ = await alice.call("POST", f"/api/deadletter/{letter}/retry", {})
    assert status == 200, answer
    assert (await get(alice, wf["id"]))["state"] == "running"
    await wait_for(lambda: _waiting(alice, ids["c"]), 15)
    c = await alice.task(ids["c"])
    assert c["attemptNo"] == 2 and c["error"] is None
    assert (await alice.history(ids["c"]))[-1]["action"] == "retry"
    runs.gate["p"].set()
    done = await finished(alice, wf["id"])  # it dies again: the letter is exhausted now
    assert done["state"] == "failed" and {x["ref"]: x["state"] for x in done["tasks"]}["c"] == "canceled"
    status, answer, _ = await alice.call("POST", f"/api/deadletter/{letter}/retry", {})
    assert status == 409 and answer["error"]["code"] == "DEAD_LETTER_EXHAUSTED", answer
    del runs.fail["p"]
    status, answer, _ = await alice.call("POST", f"/api/deadletter/{letter}/force-retry", {"reason": "fixed"})
    assert status == 200, answer
    done = await finished(alice, wf["id"])
    assert done["state"] == "succeeded", done  # c ran; comp had succeeded and kept its result
    assert runs.ran("c") == 1 and runs.ran("comp") == 1
    partitioned(done)
    frames = await workflow_events(alice, wf["id"], 4)
    assert [f.data["data"]["state"] for f in frames if f.event == "workflow.finished"] == [
        "failed",
        "failed",
        "succeeded",
    ]


async def _waiting(api: Api, task_id: str) -> bool:
    x = await api.task(task_id)
    return bool(x["state"] == "queued" and x["waitingFor"] == "dependencies")


async def test_a_task_retry_and_a_rework_of_a_failed_parent_reopen_what_it_skipped(alice: Api, runs: Runs) -> None:
    runs.fail["x"] = "failed"
    wf = await submit(alice, [t("x", maxAttempts=1), t("y", "x"), t("z", "y")])
    ids = ids_of(wf)
    assert (await finished(alice, wf["id"]))["state"] == "failed"
    assert (await alice.task(ids["z"]))["error"]["details"] == {"ref": "y", "taskId": ids["y"]}
    runs.gate["x"] = asyncio.Event()
    status, answer, _ = await alice.call("POST", f"/api/tasks/{ids['x']}/retry", {})
    assert status == 200, answer
    assert (await get(alice, wf["id"]))["state"] == "running"
    await wait_for(lambda: _waiting(alice, ids["z"]), 15)  # the cascade reopened the grandchild too
    runs.gate["x"].set()
    assert (await finished(alice, wf["id"]))["state"] == "failed"  # x failed again
    del runs.fail["x"]
    status, answer, _ = await alice.call("POST", f"/api/tasks/{ids['x']}/rework", {"reason": "fixed input"})
    assert status == 200, answer
    done = await finished(alice, wf["id"])
    assert done["state"] == "succeeded", done
    assert runs.ran("y") == 1 and runs.ran("z") == 1
    assert runs.deps["z"] == {"y": ("succeeded", {"ref": "y"})}


async def test_join_any_sees_a_running_parent_as_running_and_is_skipped_when_every_parent_lost(
    alice: Api, runs: Runs
) -> None:
    runs.gate["slow"] = asyncio.Event()
    runs.fail["l1"] = runs.fail["l2"] = "failed"
    wf = await submit(
        alice,
        [
            t("fast"), t("slow"), t("first", "fast", "slow", join="any"),
            t("l1", maxAttempts=1), t("l2", maxAttempts=1), t("none", "l1", "l2", join="any"),
        ],
    )  # fmt: skip
    ids = ids_of(wf)
    await wait_for(lambda: _state(alice, ids["first"], "succeeded"), 20)
    assert runs.deps["first"]["fast"] == ("succeeded", {"ref": "fast"})
    assert runs.deps["first"]["slow"] == ("running", None)  # its state then, result None
    none = await alice.wait_state(ids["none"], {"canceled"})
    assert none["error"]["code"] == "SKIPPED" and none["error"]["details"]["ref"] in ("l1", "l2")
    assert runs.ran("none") == 0
    runs.gate["slow"].set()
    done = await finished(alice, wf["id"])
    assert done["state"] == "failed" and done["counts"]["failed"] == 2 and done["counts"]["canceled"] == 1


async def _state(api: Api, task_id: str, state: str) -> bool:
    return bool((await api.task(task_id))["state"] == state)


async def test_max_parallel_holds_with_waiting_for_and_counts_partition_while_running(alice: Api, runs: Runs) -> None:
    runs.gate["g1"] = asyncio.Event()
    runs.gate["g2"] = runs.gate["g1"]
    wf = await submit(alice, [t("g1"), t("g2"), t("ap", requiresApproval=True), t("dep", "g1")], maxParallel=1)
    ids = ids_of(wf)

    async def one_running() -> dict[str, Any] | None:
        now = await get(alice, wf["id"])
        return now if now["counts"]["running"] == 1 else None

    now = await wait_for(one_running, 15)
    running = next(x["ref"] for x in now["tasks"] if x["state"] == "running")
    held = "g2" if running == "g1" else "g1"
    await wait_for(lambda: _waiting_for(alice, ids[held], "workflow_parallel"), 15)
    now = await get(alice, wf["id"])
    assert now["counts"]["waitingApproval"] == 1 and now["counts"]["waiting"] == 1 and now["counts"]["queued"] == 1
    partitioned(now)
    assert (await alice.task(ids["dep"]))["waitingFor"] == "dependencies"
    status, answer, _ = await alice.call("POST", f"/api/tasks/{ids['ap']}/approve", {})
    assert status == 200, answer
    await asyncio.sleep(0.3)
    assert (await get(alice, wf["id"]))["counts"]["running"] == 1  # the approved one waits its turn too
    runs.gate["g1"].set()
    done = await finished(alice, wf["id"])
    assert done["state"] == "succeeded"
    starts = sorted((s, r) for r, ss in runs.starts.items() for s in ss)
    assert len(starts) == 4


async def _waiting_for(api: Api, task_id: str, why: str) -> bool:
    return bool((await api.task(task_id))["waitingFor"] == why)


async def test_add_tasks_counts_1_to_1000_and_a_dependent_waits_for_what_the_added_add(
    alice: Api, runs: Runs, node: HandNode
) -> None:
    # the count rule on the node's request itself (the SDK may check it first)
    wf = await submit(alice, [t("hand", kind="hand")])
    offer, lease = await claimed(node, "hand")
    for n in (0, 1001):
        items = [msgspec.Raw(msgspec.json.encode({"ref": f"x{i}", "kind": "idle"})) for i in range(n)]
        answer = await ask(node, AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=items))
        assert answer["ok"] is False and answer["error"]["code"] == "INVALID_ARGUMENT", (n, answer)
    assert len((await get(alice, wf["id"]))["tasks"]) == 1
    items = [msgspec.Raw(msgspec.json.encode({"ref": f"x{i}", "kind": "idle"})) for i in range(1000)]
    answer = await ask(node, AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=items))
    assert answer.get("ok", True) is True and len(answer["tasks"]) == 1000, answer.get("error")
    # recursion: split adds part, part adds sub; merge (a dependent of split) waits for all and sees all
    runs.add["split"] = [{"kind": "wfc", "ref": "part"}]
    runs.add["part"] = [{"kind": "wfc", "ref": "sub"}]
    runs.gate["sub"] = asyncio.Event()
    wf = await submit(alice, [t("split"), t("merge", "split")])
    ids = ids_of(wf)
    await wait_for(lambda: _started(runs, "sub"), 20)
    await asyncio.sleep(0.3)
    assert runs.ran("merge") == 0 and (await alice.task(ids["merge"]))["waitingFor"] == "dependencies"
    runs.gate["sub"].set()
    done = await finished(alice, wf["id"])
    assert done["state"] == "succeeded" and len(done["tasks"]) == 4
    assert runs.starts["merge"][0] >= runs.starts["sub"][0]
    assert {r: s for r, (s, _) in runs.deps["merge"].items()} == {
        "split": "succeeded", "part": "succeeded", "sub": "succeeded"
    }  # fmt: skip


async def _started(runs: Runs, ref: str) -> bool:
    return runs.ran(ref) > 0


async def test_cancel_and_its_idempotency_key_are_audited_and_the_workflow_ends_canceled(
    alice: Api, runs: Runs
) -> None:
    runs.gate["long"] = asyncio.Event()
    wf = await submit(alice, [t("long"), t("after", "long"), t("idle", kind="idle")])
    ids = ids_of(wf)
    await alice.wait_state(ids["long"], {"running"})
    key = {"Idempotency-Key": "cancel-1"}
    status, canceled, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/cancel", {"reason": "stop"}, key)
    assert status == 200, canceled
    status, again, headers = await alice.call("POST", f"/api/workflows/{wf['id']}/cancel", {"reason": "stop"}, key)
    assert status == 200 and again["id"] == wf["id"] and headers["Idempotent-Replayed"] == "true"
    done = await finished(alice, wf["id"])
    assert done["state"] == "canceled" and done["counts"]["canceled"] == 3, done
    partitioned(done)
    after = await alice.task(ids["after"])
    assert after["state"] == "canceled" and runs.ran("after") == 0
    actions = await audit_actions(alice, wf["id"])
    assert actions == [("workflow", "create"), ("workflow", "cancel"), ("workflow", "finish")], actions
    frames = await workflow_events(alice, wf["id"], 3)
    assert [f.event for f in frames] == ["workflow.created", "workflow.canceled", "workflow.finished"]
    assert frames[2].data["data"]["state"] == "canceled" and frames[2].data["data"]["counts"]["canceled"] == 3


async def test_a_dependents_view_of_each_parent_has_every_attribute(alice: Api, runs: Runs) -> None:
    runs.artifact["art"] = b"0123456789" * 100
    runs.fail["bad"] = "failed"
    wf = await submit(alice, [t("art"), t("bad", maxAttempts=1), t("end", "art", "bad", on="finished")])
    ids = ids_of(wf)
    assert (await finished(alice, wf["id"]))["state"] == "failed"
    seen = runs.seen["end"]
    assert sorted(seen) == ["art", "bad"]
    art, bad = seen["art"], seen["bad"]
    assert (art.task_id, art.state, art.result, art.error) == (ids["art"], "succeeded", {"ref": "art"}, None)
    (meta,) = art.artifacts
    data = runs.artifact["art"]
    assert (meta["name"], meta["size"], meta["sha256"]) == ("art.bin", len(data), hashlib.sha256(data).hexdigest())
    assert meta["contentType"]
    assert (bad.task_id, bad.state, bad.result, bad.artifacts) == (ids["bad"], "failed", None, [])
    assert bad.error is not None and bad.error["code"] == "HANDLER_ERROR" and bad.error["message"] == "bad fails"


async def test_the_workflow_callback_is_retried_under_the_same_id(alice: Api, runs: Runs) -> None:
    async with receiver([500, 200]) as hook:
        wf = await submit(alice, [t("one")], callbackUrl=hook.url, callbackSecret=SECRET)
        await finished(alice, wf["id"])
        await wait_for(lambda: _got(hook, 2), 15)
        await asyncio.sleep(0.5)
    assert len(hook.got) == 2  # delivered once it was answered 2xx, not again
    assert {g.headers["X-Callback-Id"] for g in hook.got} == {f"{wf['id']}:1"}
    assert all(signed_by(SECRET, g) for g in hook.got) and hook.got[0].body == hook.got[1].body


async def test_a_workflow_retry_by_default_runs_its_canceled_dead_and_skipped_tasks_again(
    alice: Api, runs: Runs
) -> None:
    runs.fail["d"] = "dead"
    runs.gate["long"] = asyncio.Event()
    wf = await submit(alice, [t("d", maxAttempts=1), t("long"), t("after", "long"), t("ok"), t("d2", "d")])
    ids = ids_of(wf)
    await alice.wait_state(ids["d"], {"dead"})
    await alice.wait_state(ids["ok"], {"succeeded"})
    await alice.wait_state(ids["long"], {"running"})
    status, answer, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/cancel", {})
    assert status == 200, answer
    done = await finished(alice, wf["id"])
    assert done["state"] == "canceled"
    assert {x["ref"]: x["state"] for x in done["tasks"]} == {
        "d": "dead", "long": "canceled", "after": "canceled", "ok": "succeeded", "d2": "canceled"
    }  # fmt: skip
    del runs.fail["d"]
    runs.gate["long"].set()
    status, retried, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {})
    assert status == 200 and retried["state"] == "running", retried
    done = await finished(alice, wf["id"])
    assert done["state"] == "succeeded", done
    assert runs.ran("ok") == 1 and runs.ran("long") == 2 and runs.ran("after") == 1 and runs.ran("d2") == 1
    long = await alice.task(ids["long"])
    assert long["attemptNo"] == 2 and "retry" in [h["action"] for h in await alice.history(ids["long"])]
    status, letters, _ = await alice.call("GET", f"/api/deadletter?originalTaskId={ids['d']}")
    assert letters["items"][0]["retryCount"] == 1  # the dead task's retry was a redrive of its letter


async def test_an_approved_task_still_waits_for_its_parents_and_an_unapproved_one_is_skipped(
    alice: Api, runs: Runs
) -> None:
    runs.gate["g"] = asyncio.Event()
    runs.fail["bad"] = "failed"
    wf = await submit(
        alice,
        [t("g"), t("w", "g", requiresApproval=True), t("bad", maxAttempts=1), t("nap", "bad", requiresApproval=True)],
    )
    ids = ids_of(wf)
    await alice.wait_state(ids["g"], {"running"})
    assert (await alice.task(ids["w"]))["state"] == "waiting_approval"
    status, answer, _ = await alice.call("POST", f"/api/tasks/{ids['w']}/approve", {})
    assert status == 200, answer
    w = await alice.task(ids["w"])
    assert w["state"] == "queued" and w["waitingFor"] == "dependencies", w
    nap = await alice.wait_state(ids["nap"], {"canceled"})
    assert nap["error"]["code"] == "SKIPPED" and nap["error"]["details"] == {"ref": "bad", "taskId": ids["bad"]}
    await asyncio.sleep(0.3)
    assert runs.ran("w") == 0
    runs.gate["g"].set()
    done = await finished(alice, wf["id"])
    assert done["state"] == "failed" and runs.starts["w"][0] >= runs.starts["g"][0]
    partitioned(done)


async def test_a_skipped_tasks_own_retry_never_runs_it_while_its_parent_stays_failed(alice: Api, runs: Runs) -> None:
    runs.fail["a"] = "failed"
    wf = await submit(alice, [t("a", maxAttempts=1), t("b", "a"), t("c", "b")])
    ids = ids_of(wf)
    assert (await finished(alice, wf["id"]))["state"] == "failed"
    status, answer, _ = await alice.call("POST", f"/api/tasks/{ids['b']}/retry", {})
    assert status in (200, 409), answer
    done = await finished(alice, wf["id"])
    await asyncio.sleep(0.5)
    assert runs.ran("b") == 0 and runs.ran("c") == 0  # its dependency still does not hold
    b = await alice.task(ids["b"])
    assert b["state"] == "canceled" and b["error"]["code"] == "SKIPPED", b
    assert done["state"] == "failed"
    partitioned(await get(alice, wf["id"]))


async def test_a_users_cancel_of_one_task_skips_its_dependents_and_the_workflow_ends(alice: Api, runs: Runs) -> None:
    runs.gate["p"] = asyncio.Event()
    wf = await submit(alice, [t("p"), t("q", "p"), t("r", "q"), t("fin", "q", on="finished"), t("o")])
    ids = ids_of(wf)
    status, answer, _ = await alice.call("POST", f"/api/tasks/{ids['q']}/cancel", {"reason": "not needed"})
    assert status == 200, answer
    r = await alice.wait_state(ids["r"], {"canceled"})
    assert r["error"]["details"] == {"ref": "q", "taskId": ids["q"]}
    runs.gate["p"].set()
    done = await finished(alice, wf["id"])
    assert {x["ref"]: x["state"] for x in done["tasks"]} == {
        "p": "succeeded", "q": "canceled", "r": "canceled", "fin": "succeeded", "o": "succeeded"
    }  # fmt: skip
    assert done["state"] == "failed" and runs.ran("q") == 0 and runs.deps["fin"]["q"][0] == "canceled"
    partitioned(done)


async def test_an_added_task_on_an_ended_parent_is_decided_at_once_and_the_adders_dependent_sees_it(
    alice: Api, runs: Runs
) -> None:
    runs.fail["bad"] = "failed"
    runs.gate["adder"] = asyncio.Event()
    runs.add["adder"] = [
        {"kind": "wfc", "ref": "late", "dependsOn": [{"ref": "bad"}]},  # bad has failed: skipped when added
        {"kind": "wfc", "ref": "mop", "dependsOn": [{"ref": "bad", "on": "failed"}]},  # runs at once
    ]
    wf = await submit(
        alice, [t("bad", maxAttempts=1), t("adder"), t("merge", "adder"), t("fin", "adder", on="finished")]
    )
    ids = ids_of(wf)
    await alice.wait_state(ids["bad"], {"failed"})
    await alice.wait_state(ids["adder"], {"running"})
    await wait_for(lambda: _listed(alice, wf["id"], 6), 15)
    runs.gate["adder"].set()
    done = await finished(alice, wf["id"])
    states = {x["ref"]: x["state"] for x in done["tasks"]}
    assert states == {
        "bad": "failed", "adder": "succeeded", "late": "canceled", "mop": "succeeded", "merge": "canceled",
        "fin": "succeeded",
    }, states  # fmt: skip
    added = {x["ref"]: x["taskId"] for x in done["tasks"]}
    late = await alice.task(added["late"])
    assert late["error"]["details"] == {"ref": "bad", "taskId": ids["bad"]} and runs.ran("late") == 0
    merge = await alice.task(ids["merge"])
    assert merge["error"]["code"] == "SKIPPED" and merge["error"]["details"]["ref"] == "late", merge
    assert sorted(runs.deps["fin"]) == ["adder", "late", "mop"] and runs.deps["fin"]["late"][0] == "canceled"
    partitioned(done)


async def _listed(api: Api, workflow_id: str, n: int) -> bool:
    return len((await get(api, workflow_id))["tasks"]) >= n


async def test_a_retry_naming_an_unknown_ref_is_refused_and_changes_nothing(alice: Api, runs: Runs) -> None:
    runs.fail["a"] = "failed"
    wf = await submit(alice, [t("a", maxAttempts=1), t("b", "a")])
    assert (await finished(alice, wf["id"]))["state"] == "failed"
    status, answer, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {"refs": ["a", "nope"]})
    assert status == 400 and answer["error"]["code"] == "INVALID_ARGUMENT", answer
    assert answer["error"]["details"].get("ref") == "nope", answer
    await asyncio.sleep(0.3)
    now = await get(alice, wf["id"])
    assert now["state"] == "failed" and runs.ran("a") == 1
    assert await audit_actions(alice, wf["id"]) == [("workflow", "create"), ("workflow", "finish")]


async def test_a_workflow_retry_over_an_exhausted_letter_is_refused_whole(alice: Api, runs: Runs) -> None:
    runs.fail["p"] = "dead"
    runs.fail["x"] = "failed"
    wf = await submit(alice, [t("p", maxAttempts=1), t("c", "p"), t("x", maxAttempts=1)])
    ids = ids_of(wf)
    assert (await finished(alice, wf["id"]))["state"] == "failed"
    status, retried, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {})  # a redrive of p's letter
    assert status == 200, retried
    assert (await finished(alice, wf["id"]))["state"] == "failed"  # p died again: its letter is exhausted
    status, answer, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {})
    assert status == 409 and answer["error"]["code"] == "DEAD_LETTER_EXHAUSTED", answer
    await asyncio.sleep(0.3)
    now = await get(alice, wf["id"])
    assert now["state"] == "failed" and runs.ran("x") == 2 and runs.ran("p") == 2  # x was not run a third time
    assert (await alice.task(ids["x"]))["state"] == "failed"
    actions = [a for _, a in await audit_actions(alice, wf["id"])]
    assert actions == ["create", "finish", "retry", "finish"], actions


async def test_concurrent_submits_with_one_key_make_one_workflow(alice: Api) -> None:
    body = msgspec.json.encode({"name": "once", "tasks": [t("a", kind="idle"), t("b", "a", kind="idle")]})
    answers = await asyncio.gather(
        *(alice.call("POST", "/api/workflows", raw=body, headers={"Idempotency-Key": "same"}) for _ in range(6))
    )
    assert sorted(status for status, _, _ in answers) == [200] * 5 + [201], answers
    assert len({answer["id"] for _, answer, _ in answers}) == 1
    _, page, _ = await alice.call("GET", "/api/workflows")
    assert len(page["items"]) == 1
    _, tasks, _ = await alice.call("GET", "/api/tasks")
    assert len(tasks["items"]) == 2


async def test_two_retries_at_once_of_a_failed_workflow_retry_it_once(alice: Api, runs: Runs) -> None:
    runs.fail["a"] = "failed"
    wf = await submit(alice, [t("a", maxAttempts=1), t("b", "a")])
    assert (await finished(alice, wf["id"]))["state"] == "failed"
    runs.gate["a"] = asyncio.Event()  # the retried a holds: the workflow stays running
    answers = await asyncio.gather(*(alice.call("POST", f"/api/workflows/{wf['id']}/retry", {}) for _ in range(2)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 409], answers
    runs.gate["a"].set()
    await finished(alice, wf["id"])
    actions = [a for _, a in await audit_actions(alice, wf["id"])]
    assert actions.count("retry") == 1, actions


async def test_cancels_at_once_cancel_it_once(alice: Api, runs: Runs) -> None:
    runs.gate["a"] = asyncio.Event()
    wf = await submit(alice, [t("a"), t("b", "a"), t("c", kind="idle")])
    answers = await asyncio.gather(
        *(alice.call("POST", f"/api/workflows/{wf['id']}/cancel", {"reason": f"r{n}"}) for n in range(4))
    )
    assert [status for status, _, _ in answers] == [200] * 4, answers
    assert (await finished(alice, wf["id"]))["state"] == "canceled"
    actions = [a for _, a in await audit_actions(alice, wf["id"])]
    assert actions == ["create", "cancel", "finish"], actions
    frames = await workflow_events(alice, wf["id"], 3)
    assert [f.event for f in frames] == ["workflow.created", "workflow.canceled", "workflow.finished"]


async def test_cancel_of_an_ended_workflow_is_refused_and_a_second_cancel_is_a_repeat(alice: Api, runs: Runs) -> None:
    wf = await submit(alice, [t("a")])
    assert (await finished(alice, wf["id"]))["state"] == "succeeded"
    status, answer, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/cancel", {})
    assert status == 409 and answer["error"]["code"] == "INVALID_STATE_TRANSITION", answer
    other = await submit(alice, [t("idle", kind="idle")])
    for _ in range(2):
        status, answer, _ = await alice.call("POST", f"/api/workflows/{other['id']}/cancel", {})
        assert status == 200, answer
    assert (await finished(alice, other["id"]))["state"] == "canceled"
    assert [a for _, a in await audit_actions(alice, other["id"])] == ["create", "cancel", "finish"]
    assert [a for _, a in await audit_actions(alice, wf["id"])] == ["create", "finish"]


async def test_add_tasks_from_a_task_outside_a_workflow_or_with_a_parent_id_adds_nothing(
    alice: Api, node: HandNode
) -> None:
    plain = await alice.create({"kind": "hand"})
    offer, lease = await claimed(node, "hand")
    assert offer.task_id == plain["id"] and offer.workflow_id is None and offer.ref is None
    item = msgspec.Raw(msgspec.json.encode({"ref": "x", "kind": "idle"}))
    answer = await ask(node, AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=[item]))
    assert answer["ok"] is False and answer["error"]["code"] == "INVALID_ARGUMENT", answer
    wf = await submit(alice, [t("h", kind="hand")])
    offer, lease = await claimed(node, "hand")
    assert offer.workflow_id == wf["id"]
    item = msgspec.Raw(msgspec.json.encode({"ref": "x", "kind": "idle", "parentId": plain["id"]}))
    answer = await ask(node, AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=[item]))
    assert answer["ok"] is False and answer["error"]["code"] == "INVALID_ARGUMENT", answer
    assert answer["error"]["details"].get("ref") == "x", answer
    _, tasks, _ = await alice.call("GET", "/api/tasks?limit=50")
    assert len(tasks["items"]) == 2


async def test_a_rework_of_a_succeeded_task_runs_the_finished_workflow_again_and_its_callback_counts(
    alice: Api, runs: Runs
) -> None:
    async with receiver() as hook:
        wf = await submit(alice, [t("a"), t("b", "a")], callbackUrl=hook.url, callbackSecret=SECRET)
        ids = ids_of(wf)
        assert (await finished(alice, wf["id"]))["state"] == "succeeded"
        runs.gate["a"] = asyncio.Event()
        status, answer, _ = await alice.call("POST", f"/api/tasks/{ids['a']}/rework", {"reason": "new data"})
        assert status == 200, answer
        again = await get(alice, wf["id"])
        assert again["state"] == "running" and again["finishedAt"] is None, again
        runs.gate["a"].set()
        done = await finished(alice, wf["id"])
        assert done["state"] == "succeeded" and runs.ran("a") == 2
        await wait_for(lambda: _got(hook, 2), 15)
    assert [g.headers["X-Callback-Id"] for g in hook.got] == [f"{wf['id']}:1", f"{wf['id']}:2"]
    frames = await workflow_events(alice, wf["id"], 3)
    assert [f.event for f in frames] == ["workflow.created", "workflow.finished", "workflow.finished"]
