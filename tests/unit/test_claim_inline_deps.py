"""A claim batch's inline dependencies (actors/workflows/inline.py, docs/WIRE.md Claim), on the memory store: the
granted claims of a batch read their parents' edges once for the whole batch; a failed read leaves them out (the
claims stay granted, the node reads the pages); the batch's budget gives inline lists to the claims that fit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler_gateway.actors.workflows import inline
from scheduler_gateway.actors.workflows.inline import InlineDependencies
from scheduler_gateway.wire.messages import ClaimReply, ClaimRequest
from tests.unit.workflow_kit import WorkflowKit, workflow_kit


async def three_joins(k: WorkflowKit) -> tuple[dict[str, str], list[ClaimRequest]]:
    """a and b run; j0..j2 each depend on both; plain has no parents. Answers the ids and their claims."""
    joins = [{"ref": f"j{n}", "dependsOn": [{"ref": "a"}, {"ref": "b"}]} for n in range(3)]
    view = await k.submit([{"ref": "a"}, {"ref": "b"}, {"ref": "plain"}, *joins])
    ids = await k.ids(view.id)
    await k.run(ids["a"], result={"n": 1})
    await k.run(ids["b"], result={"n": 2})
    await k.drain()
    refs = ["j0", "plain", "j1", "j2"]
    return ids, [ClaimRequest(task_id=ids[r], attempt_id=(await k.task(ids[r])).attempt_id) for r in refs]


async def claim_batch(k: WorkflowKit, reqs: list[ClaimRequest]) -> list[ClaimReply]:
    replies = await asyncio.gather(*k.service.claim_many("node-a", reqs))
    assert all(r.ok for r in replies), replies
    return list(replies)


async def test_a_batch_reads_its_parents_edges_once_and_answers_each_join_inline() -> None:
    async with workflow_kit() as k:
        k.service.inline_dependencies(InlineDependencies(k.store))
        ids, reqs = await three_joins(k)
        calls: list[Any] = []
        many, one = k.store.workflows.edges_into_many, k.store.workflows.edges_into

        async def counted_many(child_ids: list[str]) -> Any:
            calls.append(("many", sorted(child_ids)))
            return await many(child_ids)

        async def counted_one(*args: Any) -> Any:
            calls.append(("one", args))
            return await one(*args)

        k.store.workflows.edges_into_many = counted_many  # type: ignore[method-assign]
        k.store.workflows.edges_into = counted_one  # type: ignore[method-assign]
        j0, plain, j1, j2 = await claim_batch(k, reqs)
        assert calls == [("many", sorted([ids["j0"], ids["j1"], ids["j2"]]))]  # one read for the batch
        assert plain.dependencies is None
        for reply in (j0, j1, j2):
            assert reply.dependencies is not None
            assert [(d.ref, d.task_id, d.state, bytes(d.result)) for d in reply.dependencies] == [
                ("a", ids["a"], "succeeded", b'{"n":1}'),
                ("b", ids["b"], "succeeded", b'{"n":2}'),
            ]


async def test_a_failed_read_leaves_the_claims_granted_without_inline_dependencies() -> None:
    async with workflow_kit() as k:
        k.service.inline_dependencies(InlineDependencies(k.store))
        _, reqs = await three_joins(k)

        async def broken(child_ids: list[str]) -> Any:
            raise ConnectionError("the store is away (test)")

        k.store.workflows.edges_into_many = broken  # type: ignore[method-assign]
        replies = await claim_batch(k, reqs)
        assert [r.dependencies for r in replies] == [None] * 4
        single = await k.service.claim("node-a", reqs[0])  # the same claim again: its lease back, still granted
        assert single.ok and single.lease_id == replies[0].lease_id and single.dependencies is None


async def test_the_batch_budget_inlines_the_claims_that_fit_and_leaves_the_rest_to_pages() -> None:
    async with workflow_kit() as k:
        # room for one join's two views (each ~100 bytes encoded), not two
        k.service.inline_dependencies(InlineDependencies(k.store, batch_bytes=300))
        _, reqs = await three_joins(k)
        j0, plain, j1, j2 = await claim_batch(k, reqs)
        assert j0.dependencies is not None and len(j0.dependencies) == 2
        assert (plain.dependencies, j1.dependencies, j2.dependencies) == (None, None, None)


async def test_a_batch_reads_at_most_its_share_of_parents_and_leaves_the_rest_to_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inline, "INLINE_BATCH_PARENTS", 3)
    async with workflow_kit() as k:
        k.service.inline_dependencies(InlineDependencies(k.store))
        view = await k.submit(
            [{"ref": r} for r in "abcd"]
            + [{"ref": "j0", "dependsOn": [{"ref": "a"}, {"ref": "b"}]}]
            + [{"ref": "j1", "dependsOn": [{"ref": "c"}, {"ref": "d"}]}]
            + [{"ref": "j2", "dependsOn": [{"ref": "a"}]}]
        )
        ids = await k.ids(view.id)
        for r in "abcd":
            await k.run(ids[r], result={"r": r})
        await k.drain()
        read: list[str] = []
        original = k.store.tasks.get_tasks

        async def counted(task_ids: list[str]) -> Any:
            read.extend(task_ids)
            return await original(task_ids)

        reqs = [ClaimRequest(task_id=ids[r], attempt_id=(await k.task(ids[r])).attempt_id) for r in ("j0", "j1", "j2")]
        k.store.tasks.get_tasks = counted  # type: ignore[method-assign]
        j0, j1, j2 = await claim_batch(k, reqs)
        assert [d.ref for d in j0.dependencies or []] == ["a", "b"]
        assert j1.dependencies is None  # c and d would make 4 parents read: its pages
        assert [d.ref for d in j2.dependencies or []] == ["a"]  # a is read already
        assert sorted(set(read) & {ids[r] for r in "abcd"}) == sorted([ids["a"], ids["b"]])
