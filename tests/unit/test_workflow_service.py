"""The workflow service and its releaser on the memory store (CONTRACT 2.12): release after the parents, the skip
and its cascade, finalizers and compensations, join any, retry (a workflow's and a single task's), cancel,
maxParallel, add_tasks, and the finish's event and callback."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model import task_machine as sm
from scheduler_gateway.actors.model.records import ActorRef
from scheduler_gateway.actors.outbox import read_outbox_body
from scheduler_gateway.actors.ports import AuditQuery
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, NotFound
from scheduler_gateway.wire.messages import ClaimRequest
from scheduler_gateway.wire.workflows import AddTasksRequest, DependenciesRequest, WorkflowCancelBody, WorkflowRetryBody
from tests.unit.service_kit import ALICE
from tests.unit.workflow_kit import WorkflowKit, workflow_kit

BOB = Caller("bob", "user", "req_bob")


def dep(ref: str, on: str = "succeeded") -> dict[str, str]:
    return {"ref": ref, "on": on}


async def retry(k: WorkflowKit, workflow_id: str, refs: list[str] | None = None) -> None:
    await k.workflows.retry(
        ALICE, workflow_id, WorkflowRetryBody(refs=refs), idempotency_key=None, body_hash="", request_id=None
    )
    await k.drain()


async def events_of(k: WorkflowKit, type_: str, workflow_id: str) -> list[dict[str, Any]]:
    """The events of the workflow in the outbox (the relay does not run here), as their wire bodies."""
    found = []
    for row in await k.store.tasks.outbox_batch(100_000):
        entry = read_outbox_body(row.body)
        assert entry is not None
        wire = msgspec.json.decode(entry.wire)
        if entry.type == type_ and wire["aggregateId"] == workflow_id:
            found.append(wire)
    return found


async def test_a_dependent_is_released_only_after_its_parents_and_never_offered_before() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "b"}, {"ref": "c", "dependsOn": [dep("a"), dep("b")]}])
        ids = await k.ids(view.id)
        assert view.counts.waiting == 1 and view.counts.queued == 2
        assert k.service.waiting_for(await k.task(ids["c"])) == "dependencies"
        # a claim of the waiting task is refused (its copy, and the store's guard)
        c = await k.task(ids["c"])
        reply = await k.service.claim("node-a", ClaimRequest(task_id=c.id, attempt_id=c.attempt_id))
        assert not reply.ok and reply.error is not None and reply.error.code == Code.NOT_DUE
        await k.run(ids["a"])
        assert (await k.states(view.id))["c"] == "waiting"
        await k.run(ids["b"])
        assert (await k.states(view.id))["c"] == "queued"
        await k.kit.dispatcher.start()  # already running: offers go out as the dispatcher wakes
        await k.run(ids["c"])
        offered = [o.task_id for o in k.kit.bus.offers]
        assert offered.index(ids["c"]) > max(offered.index(ids["a"]), offered.index(ids["b"]))
        offers = {o.task_id: o for o in k.kit.bus.offers}
        assert offers[ids["c"]].has_dependencies is True and offers[ids["a"]].has_dependencies is False
        assert offers[ids["c"]].workflow_id == view.id and offers[ids["c"]].ref == "c"
        wf = await k.workflows.get(ALICE, view.id)
        assert wf.state == "succeeded" and wf.finished_at is not None and wf.counts.succeeded == 3


async def test_a_release_records_nothing_and_a_write_that_puts_the_flag_back_is_decided_again() -> None:
    """A release moves no revision, so a write decided on a copy read before it (another instance's amend) wins
    its compare-and-set and puts ``waiting_deps`` back: its recheck notice has the releaser release it again."""
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "c", "dependsOn": [dep("a")]}])
        ids = await k.ids(view.id)
        before = await k.task(ids["c"])
        await k.run(ids["a"])
        released = await k.task(ids["c"])
        assert not released.waiting_deps and released.revision == before.revision
        assert [h.action for h in (await k.store.tasks.history(ids["c"])).items] == ["create"]
        late = msgspec.Raw(b'{"late": true}')
        amend = sm.amend(before, late, "att_" + "9" * 32, ActorRef("user", "alice"), 5.0, None)
        assert isinstance(amend, sm.Transition) and amend.task.waiting_deps  # decided on the copy from before
        await k.service.ledger.commit(amend, None)
        assert [(n.kind, n.object_id) for n in await k.store.workflows.notices(100)] == [("task", ids["c"])]
        await k.drain()
        again = await k.task(ids["c"])
        assert not again.waiting_deps and again.revision == before.revision + 1
        await k.run(ids["c"])
        assert (await k.workflows.get(ALICE, view.id)).state == "succeeded"


async def test_a_failed_parent_skips_its_dependents_down_the_graph_naming_the_parent() -> None:
    async with workflow_kit() as k:
        view = await k.submit(
            [{"ref": "a"}, {"ref": "b", "dependsOn": [dep("a")]}, {"ref": "c", "dependsOn": [dep("b")]}]
        )
        ids = await k.ids(view.id)
        await k.run(ids["a"], "failed")
        assert await k.states(view.id) == {"a": "failed", "b": "skipped", "c": "skipped"}
        b = await k.task(ids["b"])
        assert b.error is not None and b.error.code == "SKIPPED"
        assert b.error.details == {"ref": "a", "taskId": ids["a"]}
        c = await k.task(ids["c"])
        assert c.error is not None and c.error.details == {"ref": "b", "taskId": ids["b"]}
        wf = await k.workflows.get(ALICE, view.id)
        assert wf.state == "failed" and wf.counts.canceled == 2 and wf.counts.failed == 1


async def test_a_finalizer_runs_after_a_failure_and_a_compensation_only_on_failure() -> None:
    async with workflow_kit() as k:
        view = await k.submit(
            [
                {"ref": "work"},
                {"ref": "cleanup", "dependsOn": [dep("work", "finished")]},
                {"ref": "undo", "dependsOn": [dep("work", "failed")]},
            ]
        )
        ids = await k.ids(view.id)
        await k.run(ids["work"], "failed")
        assert await k.states(view.id) == {"work": "failed", "cleanup": "queued", "undo": "queued"}
        await k.run(ids["cleanup"])
        await k.run(ids["undo"])
        assert (await k.workflows.get(ALICE, view.id)).state == "failed"
        # the same workflow where the work succeeds: the compensation is skipped, the finalizer runs
        view2 = await k.submit(
            [
                {"ref": "work"},
                {"ref": "cleanup", "dependsOn": [dep("work", "finished")]},
                {"ref": "undo", "dependsOn": [dep("work", "failed")]},
            ]
        )
        ids2 = await k.ids(view2.id)
        await k.run(ids2["work"])
        assert await k.states(view2.id) == {"work": "succeeded", "cleanup": "queued", "undo": "skipped"}
        await k.run(ids2["cleanup"])
        assert (await k.workflows.get(ALICE, view2.id)).state == "succeeded"  # the skipped do not fail it


async def test_join_any_runs_after_one_parent_and_is_skipped_only_when_every_parent_lost() -> None:
    async with workflow_kit() as k:
        view = await k.submit(
            [{"ref": "a"}, {"ref": "b"}, {"ref": "j", "join": "any", "dependsOn": [dep("a"), dep("b")]}]
        )
        ids = await k.ids(view.id)
        await k.run(ids["a"], "failed")
        assert (await k.states(view.id))["j"] == "waiting"
        await k.run(ids["b"])
        assert (await k.states(view.id))["j"] == "queued"
        view2 = await k.submit(
            [{"ref": "a"}, {"ref": "b"}, {"ref": "j", "join": "any", "dependsOn": [dep("a"), dep("b")]}]
        )
        ids2 = await k.ids(view2.id)
        await k.run(ids2["a"], "failed")
        await k.run(ids2["b"], "failed")
        assert (await k.states(view2.id))["j"] == "skipped"


async def test_a_workflow_retry_reopens_the_skipped_and_keeps_succeeded_results() -> None:
    async with workflow_kit() as k:
        view = await k.submit(
            [{"ref": "a"}, {"ref": "b", "dependsOn": [dep("a")]}, {"ref": "c", "dependsOn": [dep("a"), dep("b")]}]
        )
        ids = await k.ids(view.id)
        await k.run(ids["a"], result={"n": 1})
        await k.run(ids["b"], "failed")
        assert await k.states(view.id) == {"a": "succeeded", "b": "failed", "c": "skipped"}
        assert (await k.workflows.get(ALICE, view.id)).state == "failed"
        a_before = await k.task(ids["a"])
        await retry(k, view.id)
        assert await k.states(view.id) == {"a": "succeeded", "b": "queued", "c": "waiting"}
        a_after = await k.task(ids["a"])
        assert a_after.revision == a_before.revision and bytes(a_after.result) == b'{"n":1}'
        wf = await k.workflows.get(ALICE, view.id)
        assert wf.state == "running" and wf.finished_at is None
        b = await k.task(ids["b"])
        assert b.attempt_no == 2
        await k.run(ids["b"])
        await k.run(ids["c"])
        assert (await k.workflows.get(ALICE, view.id)).state == "succeeded"
        # a retry of a workflow with nothing failed, or of a running one: 409
        with pytest.raises(Conflict) as nothing:
            await retry(k, view.id)
        assert nothing.value.code == Code.INVALID_STATE_TRANSITION


async def test_a_workflow_retry_redrives_a_dead_tasks_letter() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a", "maxAttempts": 1}, {"ref": "b", "dependsOn": [dep("a")]}])
        ids = await k.ids(view.id)
        await k.run(ids["a"], "retryable")
        assert await k.states(view.id) == {"a": "dead", "b": "skipped"}
        letter = await k.store.letters.get_dead_letter_for_task(ids["a"])
        assert letter is not None and letter.retry_count == 0
        await retry(k, view.id)
        assert await k.states(view.id) == {"a": "queued", "b": "waiting"}
        letter = await k.store.letters.get_dead_letter_for_task(ids["a"])
        assert letter is not None and letter.retry_count == 1


async def test_a_retry_naming_a_succeeded_ref_reworks_it_with_its_downstream() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "b", "dependsOn": [dep("a")]}, {"ref": "x"}])
        ids = await k.ids(view.id)
        for ref in ("a", "b", "x"):
            await k.run(ids[ref])
        await retry(k, view.id, ["a"])
        assert await k.states(view.id) == {"a": "queued", "b": "waiting", "x": "succeeded"}
        history = (await k.store.tasks.history(ids["b"])).items
        assert history[-1].action == "rework"
        with pytest.raises(Conflict) as running:
            await retry(k, view.id, ["x"])
        assert running.value.code == Code.INVALID_STATE_TRANSITION


async def test_a_single_task_retry_unskips_what_it_skipped_and_the_workflow_runs_again() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "b", "dependsOn": [dep("a")]}])
        ids = await k.ids(view.id)
        await k.run(ids["a"], "failed")
        assert (await k.workflows.get(ALICE, view.id)).state == "failed"
        await k.service.act(ALICE, ids["a"], "retry")
        await k.drain()
        assert await k.states(view.id) == {"a": "queued", "b": "waiting"}
        b = await k.task(ids["b"])
        assert b.attempt_no == 2 and b.error is None
        assert [h.action for h in (await k.store.tasks.history(ids["b"])).items][-1] == "retry"
        assert (await k.workflows.get(ALICE, view.id)).state == "running"
        await k.run(ids["a"])
        await k.run(ids["b"])
        wf = await k.workflows.get(ALICE, view.id)
        assert wf.state == "succeeded"
        finished = await events_of(k, "workflow.finished", view.id)
        assert [e["data"]["state"] for e in finished] == ["failed", "succeeded"]


async def test_cancel_ends_every_open_task_and_the_workflow_canceled() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "b", "dependsOn": [dep("a")]}, {"ref": "c"}])
        ids = await k.ids(view.id)
        await k.claim(ids["a"])
        await k.workflows.cancel(
            ALICE, view.id, WorkflowCancelBody(reason="stop"), idempotency_key=None, body_hash="", request_id=None
        )
        await k.drain()
        states = await k.states(view.id)
        assert states["a"] == "canceled" and states["c"] == "canceled"
        assert states["b"] in ("canceled", "skipped")
        assert any(node == "node-a" for node, _ in k.kit.bus.cancels)  # the running one was told
        wf = await k.workflows.get(ALICE, view.id)
        assert wf.state == "canceled"
        assert len(await events_of(k, "workflow.canceled", view.id)) == 1
        assert len(await events_of(k, "workflow.finished", view.id)) == 1


async def test_max_parallel_is_never_exceeded_by_the_offers_out() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": f"t{n}"} for n in range(6)], maxParallel=2)
        ids = await k.ids(view.id)
        await k.kit.dispatcher.start()
        for _ in range(20):
            await _turn()
        first = {o.task_id for o in k.kit.bus.offers}
        assert len(first) == 2
        held = [t for t in ids.values() if t not in first]
        assert k.service.waiting_for(await k.task(held[0])) == "workflow_parallel"
        done: set[str] = set()
        while len(done) < 6:
            out = [o.task_id for o in k.kit.bus.offers if o.task_id not in done]
            assert len(set(out)) <= 2
            await k.run(out[0])
            done.add(out[0])
            for _ in range(20):
                await _turn()
        assert (await k.workflows.get(ALICE, view.id)).state == "succeeded"


async def _turn() -> None:
    import asyncio

    await asyncio.sleep(0)


async def test_add_tasks_makes_the_adders_dependent_wait_for_everything_added() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "split"}, {"ref": "merge", "dependsOn": [dep("split")]}])
        ids = await k.ids(view.id)
        lease_id, _ = await k.claim(ids["split"])
        items = [msgspec.Raw(msgspec.json.encode({"kind": "echo", "ref": f"part{n}"})) for n in range(3)]
        req = AddTasksRequest(task_id=ids["split"], lease_id=lease_id, tasks=items)
        added = await k.workflows.add_tasks("node-a", req)
        assert [t.ref for t in added.tasks] == ["part0", "part1", "part2"] and not added.replayed
        again = await k.workflows.add_tasks("node-a", req)  # a repeat: the same ids
        assert again.replayed and [t.task_id for t in again.tasks] == [t.task_id for t in added.tasks]
        other = [msgspec.Raw(msgspec.json.encode({"kind": "echo", "ref": "part0", "priority": 5}))]
        with pytest.raises(Conflict) as conflict:
            await k.workflows.add_tasks("node-a", AddTasksRequest(task_id=ids["split"], lease_id=lease_id, tasks=other))
        assert conflict.value.code == Code.IDEMPOTENCY_CONFLICT
        held = [msgspec.Raw(msgspec.json.encode({"kind": "echo", "ref": "merge"}))]
        with pytest.raises(GatewayError) as taken:
            await k.workflows.add_tasks("node-a", AddTasksRequest(task_id=ids["split"], lease_id=lease_id, tasks=held))
        assert taken.value.code == Code.INVALID_ARGUMENT
        cyc = [msgspec.Raw(msgspec.json.encode({"kind": "echo", "ref": "late", "dependsOn": [dep("merge")]}))]
        with pytest.raises(GatewayError) as cycle:
            await k.workflows.add_tasks("node-a", AddTasksRequest(task_id=ids["split"], lease_id=lease_id, tasks=cyc))
        assert cycle.value.code == Code.INVALID_ARGUMENT
        await k.run_claimed(ids["split"], lease_id)
        assert (await k.states(view.id))["merge"] == "waiting"
        for t in added.tasks[:2]:
            await k.run(t.task_id)
        assert (await k.states(view.id))["merge"] == "waiting"
        await k.run(added.tasks[2].task_id, result={"part": 2})
        assert (await k.states(view.id))["merge"] == "queued"
        merge_lease, _ = await k.claim(ids["merge"])
        page = await k.workflows.dependencies("node-a", DependenciesRequest(task_id=ids["merge"], lease_id=merge_lease))
        assert sorted(d.ref for d in page.dependencies) == ["part0", "part1", "part2", "split"]
        part2 = next(d for d in page.dependencies if d.ref == "part2")
        assert part2.state == "succeeded" and bytes(part2.result) == b'{"part":2}'


async def test_the_finish_event_and_callback_come_once_per_finish() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}], callbackUrl="https://example.com/hook", callbackSecret="s3cret")
        ids = await k.ids(view.id)
        await k.run(ids["a"], "failed")
        await k.drain()
        await k.workflows.releaser.drain_once()
        deliveries = [d for d in await k.store.callbacks.pending_callbacks(100) if d.task_id == view.id]
        assert [d.callback_id for d in deliveries] == [f"{view.id}:1"]
        body = msgspec.json.decode(deliveries[0].body)
        assert body["workflowId"] == view.id and body["state"] == "failed" and body["counts"]["failed"] == 1
        assert len(await events_of(k, "workflow.finished", view.id)) == 1
        await retry(k, view.id)
        await k.run(ids["a"])
        deliveries = [d for d in await k.store.callbacks.pending_callbacks(100) if d.task_id == view.id]
        assert sorted(d.callback_id for d in deliveries) == [f"{view.id}:1", f"{view.id}:2"]
        assert [e["data"]["state"] for e in await events_of(k, "workflow.finished", view.id)] == ["failed", "succeeded"]


async def test_another_users_workflow_is_not_found() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}])
        with pytest.raises(NotFound) as missing:
            await k.workflows.get(BOB, view.id)
        assert missing.value.code == Code.WORKFLOW_NOT_FOUND
        with pytest.raises(NotFound):
            await k.workflows.get(ALICE, "wfl_" + "0" * 32)
        with pytest.raises(NotFound):
            await k.workflows.get(ALICE, "not-an-id")
        page = await k.workflows.list(BOB, state=None, name=None, limit=10, cursor=None)
        assert page.items == []
        page = await k.workflows.list(ALICE, state="running", name=None, limit=10, cursor=None)
        assert [w.id for w in page.items] == [view.id] and page.items[0].tasks is None


async def test_a_released_task_waits_again_when_its_parent_is_reworked_and_its_old_offer_is_stale() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "p"}, {"ref": "c", "dependsOn": [dep("p")]}])
        ids = await k.ids(view.id)
        await k.run(ids["p"])
        released = await k.task(ids["c"])
        assert released.state == "queued" and not released.waiting_deps
        await k.service.act(ALICE, ids["p"], "rework", reason="again")
        # before the releaser holds it, its copy says released: the store's guard refuses the claim, audited
        early = await k.service.claim("node-a", ClaimRequest(task_id=ids["c"], attempt_id=released.attempt_id))
        assert not early.ok and early.error is not None and early.error.code == Code.NOT_DUE
        audit = await k.store.tasks.list_audit(AuditQuery(object_id=ids["c"], action="claim"))
        assert [(a.result, a.error_code) for a in audit.items] == [("refused", Code.NOT_DUE)]
        # the refusal holds it at once (not offered again and again until the releaser gets to it)
        assert (await k.task(ids["c"])).waiting_deps
        await k.drain()
        held = await k.task(ids["c"])
        assert held.waiting_deps and held.attempt_id != released.attempt_id
        assert held.attempt_no == released.attempt_no
        # holding it again moves waitingFor and the attempt id, at the same revision, and records nothing
        assert held.revision == released.revision
        assert [h.action for h in (await k.store.tasks.history(ids["c"])).items][-1] == "create"
        stale = await k.service.claim("node-a", ClaimRequest(task_id=ids["c"], attempt_id=released.attempt_id))
        assert not stale.ok and stale.error is not None and stale.error.code == Code.ATTEMPT_STALE
        await k.run(ids["p"])
        await k.run(ids["c"])
        assert (await k.workflows.get(ALICE, view.id)).state == "succeeded"


async def test_a_task_skipped_by_a_cancel_runs_again_with_the_workflows_retry() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "b", "dependsOn": [dep("a")]}])
        ids = await k.ids(view.id)
        # the cancel's flag is set and the cancel has not reached b yet when a's end releases it: b is skipped
        wf = await k.store.workflows.get_workflow(view.id)
        assert wf is not None
        flagged = msgspec.structs.replace(wf, canceled=True, revision=wf.revision + 1)
        assert await k.store.workflows.swap_workflow(flagged, expected_revision=wf.revision)
        await k.run(ids["a"])
        b = await k.task(ids["b"])
        assert b.state == "canceled" and b.error is not None and b.error.code == "SKIPPED"
        assert b.error.details is not None and b.error.details["taskId"] == view.id
        assert b.error.message == f"workflow {view.id} was canceled"
        assert (await k.workflows.get(ALICE, view.id)).state == "canceled"
        await retry(k, view.id)
        assert await k.states(view.id) == {"a": "succeeded", "b": "queued"}
        await k.run(ids["b"])
        assert (await k.workflows.get(ALICE, view.id)).state == "succeeded"


async def test_max_parallel_offers_its_held_tasks_oldest_first_when_slots_free() -> None:
    async with workflow_kit() as k:
        view = await k.submit([{"ref": f"t{n}"} for n in range(6)], maxParallel=2)
        ids = await k.ids(view.id)
        order = [ids[f"t{n}"] for n in range(6)]

        async def offered() -> list[str]:
            for _ in range(20):
                await _turn()
            seen: list[str] = []
            for o in k.kit.bus.offers:
                if o.task_id not in seen:
                    seen.append(o.task_id)
            return seen

        assert await offered() == order[:2]
        leases = {t: (await k.claim(t))[0] for t in order[:2]}  # a claim keeps its slot: nothing moves
        assert await offered() == order[:2]
        await k.run_claimed(order[0], leases[order[0]])
        assert await offered() == order[:3]
        await k.run_claimed(order[1], leases[order[1]])
        assert await offered() == order[:4]


async def test_a_release_made_elsewhere_reaches_this_instances_copy_when_it_reads_the_task() -> None:
    """Several instances: a release commits at the task's revision, so a copy read before it looks current by
    revision; a read of the row (a claim or an API read through this instance) takes the moved flag in."""
    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "c", "dependsOn": [dep("a")]}])
        ids = await k.ids(view.id)
        ledger = k.service.ledger
        waiting = await k.task(ids["c"])
        assert ledger.live[ids["c"]].waiting_deps
        released = msgspec.structs.replace(waiting, waiting_deps=False)  # the row as another instance left it
        ledger.absorb(released, ids["c"])
        assert not ledger.live[ids["c"]].waiting_deps
        # a hold elsewhere gives the task a new attempt there: the instance that made it offers it, this one lets go
        held = msgspec.structs.replace(released, waiting_deps=True, attempt_id="att_" + "7" * 32)
        ledger.absorb(held, ids["c"])
        assert ids["c"] not in ledger.live


async def test_a_skip_cancels_the_tasks_created_under_the_skipped_task_as_any_cancel() -> None:
    """A skip is the table's cancel: a task created under a waiting workflow task (parentId) is canceled with it
    in one transaction (the simulation found it left queued under its canceled ancestor)."""
    from scheduler_gateway.actors.tasks import NewTask

    async with workflow_kit() as k:
        view = await k.submit([{"ref": "a"}, {"ref": "b", "dependsOn": [dep("a")]}])
        ids = await k.ids(view.id)
        child, _ = await k.service.create(ALICE, NewTask(kind="echo", parent_id=ids["b"]))
        grandchild, _ = await k.service.create(ALICE, NewTask(kind="echo", parent_id=child.id))
        await k.run(ids["a"], "failed")
        await k.drain()
        b = await k.task(ids["b"])
        assert b.state == "canceled" and b.error is not None and b.error.code == "SKIPPED"
        for tid in (child.id, grandchild.id):
            under = await k.task(tid)
            assert under.state == "canceled", under
        history = (await k.store.tasks.history(child.id)).items
        assert history[-1].action == "cancel" and history[-1].reason == f"parent {ids['b']} canceled"
