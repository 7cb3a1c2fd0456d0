"""Contract of the TaskStore port for cancel cascades, run against every implementation: a group of changes
commits whole or not at all, a group that closes a subtree is refused while a task below it is still
active, and no write leaves an active task under a canceled parent (or creates one under a terminal one).
Also the console overview's counts (tasks by state and kind, the callback backlog), whole and of one owner."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_gateway.wire.errors import Code, Conflict

from .test_store_contract import assert_code, bump, create, finish, harness, leaving, make_task, store, update

__all__ = ["harness", "store"]  # the fixtures, imported for pytest


async def _cancel(store: Any, *tasks: Any, root: str | None = None) -> None:
    await store.tasks.apply_group([update(t, bump(t, state="canceled"), "cancel") for t in tasks], subtree_root=root)


async def test_a_group_commits_whole_or_not_at_all(store: Any) -> None:
    a, b = make_task(1), make_task(2)
    await store.tasks.apply(create(a))
    await store.tasks.apply(create(b))
    stale_b = bump(b)  # revision 2: the stored row is at 1, so this CAS is refused
    with pytest.raises(Conflict) as info:
        await store.tasks.apply_group([update(a, bump(a, state="canceled"), "cancel"), update(stale_b, bump(stale_b))])
    assert_code(info.value, Conflict, Code.REVISION_CONFLICT)
    assert (await store.tasks.get_task(a.id)).state == "queued"  # the first change of the group did not stay
    assert len((await store.tasks.history(a.id)).items) == 1
    await _cancel(store, a, b)
    assert {(await store.tasks.get_task(t.id)).state for t in (a, b)} == {"canceled"}


async def test_a_group_that_closes_a_subtree_is_refused_while_a_task_below_is_active(store: Any) -> None:
    root = make_task(1)
    child = make_task(2, parent_id=root.id)
    grandchild = make_task(3, parent_id=child.id)  # stays active below a finished child: still in the subtree
    for t in (root, child, grandchild):
        await store.tasks.apply(create(t))
    done_child = bump(child, state="succeeded")
    await store.tasks.apply(update(child, done_child, "settle"))
    with pytest.raises(Conflict) as info:
        await _cancel(store, root, root=root.id)  # the caller's read missed the grandchild
    assert_code(info.value, Conflict, Code.REVISION_CONFLICT)
    assert info.value.details["taskId"] == grandchild.id
    assert (await store.tasks.get_task(root.id)).state == "queued"
    await _cancel(store, root, grandchild, root=root.id)
    assert (await store.tasks.get_task(grandchild.id)).state == "canceled"
    assert (await store.tasks.get_task(done_child.id)).state == "succeeded"


@pytest.mark.parametrize("parent_state", ["canceled", "succeeded", "failed", "dead"])
async def test_no_task_is_created_under_a_terminal_parent(store: Any, parent_state: str) -> None:
    parent = make_task(1, state=parent_state)
    await store.tasks.apply(create(parent))
    await assert_child_refused(store, parent.id)


async def assert_child_refused(store: Any, parent_id: str) -> None:
    """A create under ``parent_id`` is refused TASK_ALREADY_TERMINAL, alone and in a batch beside a write that
    goes through (only the child is refused)."""
    child = make_task(2, parent_id=parent_id)
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(create(child))
    assert_code(info.value, Conflict, Code.TASK_ALREADY_TERMINAL)
    assert info.value.details["parentId"] == parent_id
    assert await store.tasks.get_task(child.id) is None
    other = make_task(3)
    results = await store.tasks.apply_many([create(other), create(child)])
    assert results[0] is None
    assert_code(results[1], Conflict, Code.TASK_ALREADY_TERMINAL)
    assert await store.tasks.get_task(child.id) is None and await store.tasks.get_task(other.id) is not None


async def test_a_child_cannot_be_created_in_the_batch_after_its_parent_was_canceled(store: Any) -> None:
    parent = make_task(1)
    await store.tasks.apply(create(parent))
    child = make_task(2, parent_id=parent.id)
    # in order: the parent's cancel, then the child's insert; a store that writes inserts first must not
    # let the child slip in
    results = await store.tasks.apply_many([update(parent, bump(parent, state="canceled"), "cancel"), create(child)])
    assert results[0] is None
    assert_code(results[1], Conflict, Code.TASK_ALREADY_TERMINAL)
    assert await store.tasks.get_task(child.id) is None


async def test_a_child_created_in_the_batch_before_its_dead_parent_is_retried_is_refused(store: Any) -> None:
    parent = make_task(1, state="dead")
    await store.tasks.apply(create(parent))
    child = make_task(2, parent_id=parent.id)
    retry = leaving(update(parent, bump(parent, state="queued"), "retry"), "dead")
    # in order: the child's insert under the dead parent, then the parent's retry
    results = await store.tasks.apply_many([create(child), retry])
    assert_code(results[0], Conflict, Code.TASK_ALREADY_TERMINAL)
    assert results[1] is None
    assert await store.tasks.get_task(child.id) is None and (await store.tasks.get_task(parent.id)).state == "queued"


async def test_a_canceled_child_is_not_requeued_under_a_canceled_parent(store: Any) -> None:
    parent = make_task(1)
    child = make_task(2, parent_id=parent.id)
    await store.tasks.apply(create(parent))
    await store.tasks.apply(create(child))
    await _cancel(store, parent, child, root=parent.id)
    canceled_child = await store.tasks.get_task(child.id)
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(update(canceled_child, bump(canceled_child, state="queued"), "retry"))
    assert_code(info.value, Conflict, Code.TASK_ALREADY_TERMINAL)
    assert (await store.tasks.get_task(child.id)).state == "canceled"
    # a parent that merely finished (not canceled) lets its failed child be retried
    parent2 = make_task(3)
    child2 = make_task(4, parent_id=parent2.id)
    await store.tasks.apply(create(parent2))
    await store.tasks.apply(create(child2))
    failed_child = bump(child2, state="failed")
    await store.tasks.apply(update(child2, failed_child, "settle"))
    await store.tasks.apply(update(parent2, bump(parent2, state="succeeded"), "settle"))
    await store.tasks.apply(update(failed_child, bump(failed_child, state="queued"), "retry"))
    assert (await store.tasks.get_task(child2.id)).state == "queued"


async def test_task_counts_group_by_state_and_kind(store: Any) -> None:
    for n, (state, kind, owner) in enumerate(
        [
            ("queued", "echo", "alice"),
            ("queued", "echo", "alice"),
            ("failed", "work", "alice"),
            ("queued", "echo", "bob"),
        ],
        start=1,
    ):
        await store.tasks.apply(create(make_task(n, state=state, kind=kind, owner=owner)))
    assert sorted(await store.tasks.task_counts()) == [("failed", "work", 1), ("queued", "echo", 3)]
    assert sorted(await store.tasks.task_counts("alice")) == [("failed", "work", 1), ("queued", "echo", 2)]
    assert await store.tasks.task_counts("nobody") == []


async def test_callback_backlog_of_an_owner_counts_its_tasks_deliveries(store: Any) -> None:
    """The overview of a user shows the deliveries of its own tasks only; an admin's, every delivery."""
    tasks = [make_task(n, owner=owner) for n, owner in enumerate(["alice", "bob", "bob", "carol"], start=1)]
    await store.tasks.apply_many([create(t) for t in tasks])
    await store.tasks.apply_many([finish(t, n) for n, t in enumerate(tasks[:3], start=1)])  # carol's has none
    assert await store.callbacks.callback_backlog() == 3
    assert await store.callbacks.callback_backlog(None) == 3
    assert (await store.callbacks.callback_backlog("alice"), await store.callbacks.callback_backlog("bob")) == (1, 2)
    assert (
        await store.callbacks.callback_backlog("carol") == 0 and await store.callbacks.callback_backlog("nobody") == 0
    )
    (first, *_) = await store.callbacks.pending_callbacks(10)  # alice's (the lowest id among equal due times)
    await store.callbacks.finish_callback(first.id)
    assert first.owner == "alice" and await store.callbacks.callback_backlog("alice") == 0
    assert await store.callbacks.callback_backlog() == 2 and await store.callbacks.callback_backlog("bob") == 2
