"""Contract of the artifact index (``ArtifactStore``, docs/ARTIFACTS.md), run against every implementation
(SQLite, memory, PostgreSQL): a row is recorded with its audit entry and event only while the task runs at the
revision the lease was checked at; the same name again is a repeat with the same digest and IDEMPOTENCY_CONFLICT
with another; the limits refuse with PAYLOAD_TOO_LARGE and write nothing; retention marks, then deletes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry, EventRecord, Task
from scheduler_gateway.actors.ports import AuditQuery
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, PayloadTooLarge

from .test_store_contract import T0, assert_code, bump, create, harness, make_task, store, update

__all__ = ["harness", "store"]  # the fixtures, imported for pytest

LIMITS = ArtifactLimits(max_bytes=1000, max_per_task=3, max_task_bytes=1500)
_n = 0


def rec(task: Task, name: str, size: int = 10, sha: str = "a" * 64, **kw: Any) -> ArtifactRecord:
    return ArtifactRecord(
        task_id=task.id, name=name, size=size, sha256=sha, content_type="text/plain", attempt_no=1,
        node_id="n1", created_at=T0, upload=kw.pop("upload", f"n1.upl_{task.id[-6:]}{name.replace('/', '')}"),
        chunks=1, owner=task.owner, **kw,
    )  # fmt: skip


def audit_event(r: ArtifactRecord) -> tuple[AuditEntry, EventRecord]:
    global _n
    _n += 1
    audit = AuditEntry(
        id=f"aud_art_{_n}", at=T0, action="artifact.add", object_type="task", object_id=r.task_id, result="ok",
        actor=ActorRef("node", "n1"), owner=r.owner,
    )  # fmt: skip
    event = EventRecord(
        id=f"evt_art_{_n}", type="task.artifact_added", aggregate_type="task", aggregate_id=r.task_id,
        owner=r.owner, revision=2, at=T0, request_id=None, data={"name": r.name},
    )  # fmt: skip
    return audit, event


async def running(store: Any, n: int) -> Task:
    t = make_task(n)
    await store.tasks.apply(create(t))
    r = bump(t, state="running", lease_id=f"lse_{n}", node_id="n1", started_at=T0, updated_at=T0)
    await store.tasks.apply(update(t, r, "claim", lease_id=r.lease_id))
    return r


async def put(
    store: Any, task: Task, r: ArtifactRecord, limits: ArtifactLimits = LIMITS
) -> tuple[ArtifactRecord, bool]:
    audit, event = audit_event(r)
    return await store.artifacts.record_artifact(r, audit, event, task_revision=task.revision, limits=limits)


async def test_an_artifact_is_recorded_once_with_its_audit_and_event(store: Any) -> None:
    t = await running(store, 1)
    outbox_before = len(await store.tasks.outbox_batch(1000))
    a = rec(t, "report.txt")
    audit, event = audit_event(a)
    assert await store.artifacts.record_artifact(a, audit, event, task_revision=t.revision, limits=LIMITS) == (a, True)
    assert await store.artifacts.get_artifact(t.id, "report.txt") == a
    assert await store.artifacts.get_artifact(t.id, "other") is None
    # the same name and digest again: a repeat, nothing written
    again = msgspec.structs.replace(a, upload="n1.upl_other", created_at=T0 + 5)
    assert await put(store, t, again) == (a, False)
    # another digest: refused
    with pytest.raises(Conflict) as exc:
        await put(store, t, msgspec.structs.replace(a, sha256="b" * 64))
    assert_code(exc.value, Conflict, Code.IDEMPOTENCY_CONFLICT)
    b = rec(t, "img/b.png", size=20)
    await put(store, t, b)
    assert await store.artifacts.list_artifacts(t.id) == [a, b]  # oldest first
    assert await store.artifacts.artifact_counts([t.id, "tsk_none"]) == {t.id: 2}
    assert await store.artifacts.artifact_usage(t.id) == (2, 30)
    assert await store.artifacts.artifact_totals() == (2, 30)
    assert len(await store.tasks.outbox_batch(1000)) == outbox_before + 2
    audit = (await store.tasks.list_audit(AuditQuery(object_id=t.id, action="artifact.add"))).items
    assert len(audit) == 2
    assert await store.artifacts.known_uploads([a.upload, "n1.upl_none", b.upload]) == {a.upload, b.upload}


async def test_only_a_running_task_at_the_checked_revision_takes_an_artifact(store: Any) -> None:
    t = await running(store, 2)
    stale = msgspec.structs.replace(t, revision=t.revision - 1)
    with pytest.raises(Conflict) as exc:
        await put(store, stale, rec(t, "x"))
    assert exc.value.code == Code.REVISION_CONFLICT
    done = bump(t, state="succeeded", finished_at=T0 + 1, updated_at=T0 + 1)
    await store.tasks.apply(update(t, done, "settle"))
    with pytest.raises(Conflict):
        await put(store, done, rec(t, "x"))
    with pytest.raises(Conflict):
        await put(store, t, rec(t, "x"))
    assert await store.artifacts.list_artifacts(t.id) == []
    missing = make_task(99, state="running", revision=2)
    with pytest.raises(Conflict):
        await put(store, missing, rec(missing, "x"))


async def test_the_limits_refuse_and_write_nothing(store: Any) -> None:
    t = await running(store, 3)
    with pytest.raises(PayloadTooLarge):
        await put(store, t, rec(t, "big", size=1001))  # max_bytes
    await put(store, t, rec(t, "a", size=900))
    with pytest.raises(PayloadTooLarge) as exc:
        await put(store, t, rec(t, "b", size=700))  # max_task_bytes: 900 + 700 > 1500
    assert exc.value.details["limit"] == "max_task_bytes"
    await put(store, t, rec(t, "b", size=1))
    await put(store, t, rec(t, "c", size=1))
    with pytest.raises(PayloadTooLarge) as exc:
        await put(store, t, rec(t, "d", size=1))  # max_per_task
    assert exc.value.details["limit"] == "max_per_task"
    assert [r.name for r in await store.artifacts.list_artifacts(t.id)] == ["a", "b", "c"]
    assert await store.artifacts.artifact_usage(t.id) == (3, 902)  # the refusals counted nothing


async def test_retention_marks_the_rows_of_old_finished_tasks_then_deletes_them(store: Any) -> None:
    t, live = await running(store, 4), await running(store, 5)
    a, b, c = rec(t, "a"), rec(t, "b"), rec(live, "c")
    for task, r in ((t, a), (t, b), (live, c)):
        await put(store, task, r)
    done = bump(t, state="succeeded", finished_at=T0 + 10, updated_at=T0 + 10)
    await store.tasks.apply(update(t, done, "settle"))
    assert await store.artifacts.mark_artifacts_removing(T0 + 5, 10) == []  # not old enough
    marked = await store.artifacts.mark_artifacts_removing(T0 + 10, 1)
    assert [r.name for r in marked] == ["a"] and marked[0].removing
    # a marked row is hidden, still counted where bytes are concerned, and comes back first next round
    assert [r.name for r in await store.artifacts.list_artifacts(t.id)] == ["b"]
    assert await store.artifacts.get_artifact(t.id, "a") is None
    assert await store.artifacts.artifact_usage(t.id) == (2, 20)
    assert [r.name for r in await store.artifacts.mark_artifacts_removing(T0 + 10, 10)] == ["a", "b"]
    assert await store.artifacts.delete_artifacts([(t.id, "a"), (t.id, "gone")]) == 1
    assert await store.artifacts.artifact_usage(t.id) == (1, 10)
    assert await store.artifacts.delete_artifacts([(t.id, "a"), (t.id, "b")]) == 1  # a twice: counted once
    assert await store.artifacts.artifact_usage(t.id) == (0, 0) and await store.artifacts.artifact_usage(live.id) == (
        1,
        10,
    )
    assert await store.artifacts.delete_artifacts([]) == 0
    assert await store.artifacts.list_artifacts(t.id) == [] and await store.artifacts.artifact_totals() == (1, 10)
    assert await store.artifacts.mark_artifacts_removing(T0 + 10, 10) == []
    assert await store.artifacts.list_artifacts(live.id) == [c]


async def test_retention_keeps_a_task_until_its_artifacts_are_gone(store: Any) -> None:
    t = await running(store, 6)
    await put(store, t, rec(t, "a"))
    done = bump(t, state="succeeded", finished_at=T0 + 1, updated_at=T0 + 1)
    await store.tasks.apply(update(t, done, "settle"))
    result = await store.retention.purge_tasks(T0 + 2, 10)
    assert result.kept == 1 and await store.tasks.get_task(t.id) is not None
    await store.artifacts.mark_artifacts_removing(T0 + 2, 10)
    await store.artifacts.delete_artifacts([(t.id, "a")])
    result = await store.retention.purge_tasks(T0 + 2, 10)
    assert result.purged["tasks"] == 1 and await store.tasks.get_task(t.id) is None


async def test_the_sqlite_usage_migration_counts_the_artifacts_already_recorded(tmp_path: Any) -> None:
    import sqlite3

    from scheduler_gateway.daemon.store.artifacts import ARTIFACT_USAGE_MIGRATION
    from scheduler_gateway.daemon.store.sqlite import SqliteStore

    path = tmp_path / "gw.sqlite3"
    s = SqliteStore(path)
    await s.start()
    t = await running(s, 7)
    await put(s, t, rec(t, "a", size=10))
    await put(s, t, rec(t, "b", size=32))
    await s.stop()
    with sqlite3.connect(path) as db:  # the rows as written before the usage table existed, then its migration
        db.execute("DROP TABLE artifact_usage")
        for sql in ARTIFACT_USAGE_MIGRATION:
            db.execute(sql)
    s = SqliteStore(path)
    await s.start()
    try:
        assert await s.artifacts.artifact_usage(t.id) == (2, 42)
    finally:
        await s.stop()


async def test_a_row_past_its_freshness_deadline_on_the_stores_clock_is_refused(store: Any) -> None:
    import time

    from .test_store_contract import PG_CLOCK

    saved, PG_CLOCK[0] = PG_CLOCK[0], time.time()  # the PostgreSQL harness's clock (the database's outside tests)
    try:
        await _past_the_deadline(store)
    finally:
        PG_CLOCK[0] = saved


async def _past_the_deadline(store: Any) -> None:
    import time

    t = await running(store, 8)
    late = rec(t, "late.bin")
    audit, event = audit_event(late)
    with pytest.raises(GatewayError) as exc:
        await store.artifacts.record_artifact(
            late, audit, event, task_revision=t.revision, limits=LIMITS, fresh_until=time.time() - 5
        )
    assert exc.value.code == Code.INVALID_ARGUMENT and exc.value.details["reason"] == "expired"
    assert await store.artifacts.get_artifact(t.id, "late.bin") is None and await store.artifacts.artifact_usage(
        t.id
    ) == (0, 0)
    assert await store.artifacts.record_artifact(
        late, audit, event, task_revision=t.revision, limits=LIMITS, fresh_until=time.time() + 3600
    ) == (late, True)


def test_the_sqlite_retention_of_artifacts_walks_the_artifacts_not_the_finished_tasks(tmp_path: Any) -> None:
    """A keeper round's mark reads the artifacts and probes each one's task: the planner, left to itself, walked
    the finished tasks' index instead (5.8 s on the growth bench's million tasks with no artifact, in the writer,
    every round; 53 us this way)."""
    import asyncio
    import sqlite3

    from scheduler_gateway.daemon.store.artifacts import SQL_MARK_REMOVING
    from scheduler_gateway.daemon.store.sqlite import SqliteStore

    async def make() -> None:
        s = SqliteStore(tmp_path / "gw.sqlite3")
        await s.start()
        await s.stop()

    asyncio.run(make())
    with sqlite3.connect(tmp_path / "gw.sqlite3") as db:
        plan = [str(r[3]) for r in db.execute("EXPLAIN QUERY PLAN " + SQL_MARK_REMOVING, (T0, 10))]
    inner = plan[plan.index("LIST SUBQUERY 1") + 1 :]  # the subquery that picks the rows
    assert inner[0] == "SCAN a" and inner[1].startswith("SEARCH t USING"), plan
