"""A workflow's submit is checked whole before anything is written (CONTRACT 2.12): every refusal with its code
and the item it names, a cycle listed in order; and the task machine's workflow transitions."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model import task_machine as sm
from scheduler_gateway.actors.model.records import Dependency, Task
from scheduler_gateway.actors.workflows.submit import find_cycle
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError
from scheduler_gateway.wire.workflows import CreateWorkflowBody
from tests.unit.service_kit import ALICE
from tests.unit.workflow_kit import WorkflowKit, body, workflow_kit


def test_find_cycle_names_one_cycle_in_dependency_order() -> None:
    assert find_cycle({"a": [], "b": ["a"], "c": ["b"]}) is None
    cycle = find_cycle({"a": ["c"], "b": ["a"], "c": ["b"], "d": ["a"]})
    assert cycle is not None and sorted(cycle) == ["a", "b", "c"]
    # each ref depends on the next, the last on the first
    parents = {"a": ["c"], "b": ["a"], "c": ["b"]}
    for n, ref in enumerate(cycle):
        assert cycle[(n + 1) % len(cycle)] in parents[ref]
    assert find_cycle({"self": ["self"]}) == ["self"]
    chain = {f"t{n}": [f"t{n - 1}"] if n else [] for n in range(20_000)}
    assert find_cycle(chain) is None  # no recursion limit on a long chain
    chain["t0"] = ["t19999"]
    found = find_cycle(chain)
    assert found is not None and len(found) == 20_000


async def refusal(k: WorkflowKit, tasks: list[dict[str, Any]], **fields: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        await k.submit(tasks, **fields)
    assert await k.store.workflows.list_workflows(None, state=None, name=None, limit=10, cursor=None) == ([], None)
    assert await k.store.tasks.active_tasks() == []  # nothing was created
    return caught.value


async def test_every_refusal_names_its_item_and_creates_nothing() -> None:
    async with workflow_kit() as k:
        e = await refusal(k, [])
        assert e.code == Code.INVALID_ARGUMENT and e.details["field"] == "tasks"
        e = await refusal(k, [{"ref": "a"}, {"ref": "a"}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["ref"] == "a"
        e = await refusal(k, [{"ref": "a", "dependsOn": [{"ref": "ghost"}]}])
        assert e.code == Code.INVALID_ARGUMENT and e.details == {"ref": "a", "dependsOn": "ghost"}
        e = await refusal(k, [{"ref": "a"}, {"ref": "b", "dependsOn": [{"ref": "a"}, {"ref": "a", "on": "failed"}]}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["ref"] == "b"
        e = await refusal(
            k,
            [
                {"ref": "x"},
                {"ref": "a", "dependsOn": [{"ref": "c"}, {"ref": "x"}]},
                {"ref": "b", "dependsOn": [{"ref": "a"}]},
                {"ref": "c", "dependsOn": [{"ref": "b"}]},
            ],
        )
        assert e.code == Code.INVALID_ARGUMENT and sorted(e.details["cycle"]) == ["a", "b", "c"]
        assert e.details["ref"] == e.details["cycle"][0]
        e = await refusal(k, [{"ref": "a", "parentId": "tsk_" + "0" * 32}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["ref"] == "a" and e.details["field"] == "parentId"
        e = await refusal(k, [{"ref": "a"}, {"ref": "b", "maxAttempts": 0}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["ref"] == "b"
        e = await refusal(k, [{"ref": "a", "labels": {"gw.mine": "x"}}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["ref"] == "a" and e.details["field"] == "labels"
        e = await refusal(k, [{"ref": "bad ref"}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["index"] == 0
        e = await refusal(k, [{"ref": "a", "uniqueForSeconds": 5}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["ref"] == "a"
        e = await refusal(k, [{"ref": "a", "join": "some"}])
        assert e.code == Code.INVALID_ARGUMENT and e.details["ref"] == "a"
        many = CreateWorkflowBody(tasks=[msgspec.Raw(b'{"kind":"echo","ref":"a"}')] * 10_001)
        with pytest.raises(GatewayError) as too_many:
            await k.workflows.submit(ALICE, many, idempotency_key=None, body_hash="", request_id=None)
        assert too_many.value.code == Code.INVALID_ARGUMENT and too_many.value.details["field"] == "tasks"


async def test_an_idempotency_key_replays_the_same_body_and_refuses_another() -> None:
    async with workflow_kit() as k:
        b = body([{"ref": "a"}, {"ref": "b", "dependsOn": [{"ref": "a"}]}], name="once")
        first, replayed = await k.workflows.submit(ALICE, b, idempotency_key="k1", body_hash="h1", request_id=None)
        assert not replayed
        again, replayed = await k.workflows.submit(ALICE, b, idempotency_key="k1", body_hash="h1", request_id=None)
        assert replayed and again.id == first.id
        with pytest.raises(Conflict) as other:
            await k.workflows.submit(ALICE, b, idempotency_key="k1", body_hash="h2", request_id=None)
        assert other.value.code == Code.IDEMPOTENCY_CONFLICT
        page = await k.workflows.list(ALICE, state=None, name=None, limit=10, cursor=None)
        assert [w.id for w in page.items] == [first.id]


def _task(**fields: Any) -> Task:
    base: dict[str, Any] = dict(
        id="tsk_" + "1" * 32,
        owner="alice",
        kind="echo",
        state="queued",
        revision=1,
        attempt_id="att_" + "1" * 32,
        run_id="run_" + "1" * 32,
        not_before=0.0,
        created_at=0.0,
        updated_at=0.0,
        workflow_id="wfl_" + "1" * 32,
        ref="b",
        depends_on=(Dependency("a"),),
        waiting_deps=True,
    )
    base.update(fields)
    return Task(**base)


def test_the_machines_workflow_transitions() -> None:
    waiting = _task()
    with pytest.raises(Conflict) as early:
        sm.claim(waiting, waiting.attempt_id, "node-a", "lse_x", 1.0)
    assert early.value.code == Code.NOT_DUE
    released = sm.dependencies_met(waiting, 1.0)
    assert isinstance(released, sm.Transition) and not released.task.waiting_deps
    # a move of waitingFor, not a change of the state machine: the revision stays, nothing is recorded
    assert not released.recorded and released.task.revision == waiting.revision
    assert isinstance(sm.dependencies_met(released.task, 2.0), sm.Repeat)
    held = sm.dependencies_reopened(released.task, "att_" + "2" * 32, 2.0)
    assert isinstance(held, sm.Transition) and held.task.waiting_deps and not held.recorded
    assert held.task.attempt_id == "att_" + "2" * 32 and held.task.attempt_no == released.task.attempt_no
    skipped = sm.skip(waiting, "a", "tsk_" + "0" * 32, "failed", 3.0)
    assert skipped.task.state == "canceled" and (skipped.history.action, skipped.history.reason) == (
        "cancel",
        "SKIPPED",
    )
    assert skipped.recorded and skipped.event_type == "task.canceled"
    assert skipped.task.error is not None and skipped.task.error.code == "SKIPPED"
    assert skipped.task.error.details == {"ref": "a", "taskId": "tsk_" + "0" * 32}
    assert "a ended failed" in skipped.task.error.message
    back = sm.unskip(skipped.task, "att_" + "3" * 32, 4.0)
    assert back.task.state == "queued" and back.task.waiting_deps and back.history.action == "retry"
    assert back.task.attempt_no == skipped.task.attempt_no + 1 and back.task.error is None
    with pytest.raises(Conflict):
        sm.skip(skipped.task, "a", "x", "failed", 5.0)  # terminal: nothing to skip
    done = sm.cancel(released.task, sm.RELEASER, 5.0, None, "x")
    assert isinstance(done, sm.Transition)
    with pytest.raises(Conflict):
        sm.unskip(done.task, "att_" + "4" * 32, 6.0)  # canceled by a user: not a skip
