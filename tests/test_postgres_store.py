"""What only the PostgreSQL store has to show (the shared contract is in tests/test_store_contract*.py and
tests/test_schedule_store.py): several stores on one database claim disjoint schedules and meet the partial
unique indexes; a newer schema is refused; ids page in byte order; the URL is parsed and always redacted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import psycopg
import pytest

from scheduler_gateway.actors.ports import Change, TaskQuery
from scheduler_gateway.actors.schedule_ports import ActiveRunConflict
from scheduler_gateway.daemon.config import ConfigError, load_config
from scheduler_gateway.daemon.config.store_url import StoreUrlError, parse_store_url
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres import db as pg_db
from scheduler_gateway.daemon.store.postgres.migrations import SCHEMA_VERSION
from scheduler_gateway.daemon.store.postgres.tasks import write_change
from scheduler_gateway.wire.errors import Code, Conflict, StorageError

from .test_schedule_store import T0, run, schedule
from .test_store_contract import bump, event_for, make_task


async def test_two_instances_claim_disjoint_schedules(two_pg_stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = two_pg_stores
    for n in range(1, 41):
        await a.schedules.insert_schedule(schedule(n, next_run_at=T0))
    got = await asyncio.gather(*(s.schedules.claim_due(T0 + 1, 60, 5) for s in (a, b) for _ in range(4)))
    ids = [c.task.id for claims in got for c in claims]
    assert len(ids) == len(set(ids)) == 40  # every due schedule once, none twice
    assert await a.schedules.claim_due(T0 + 1, 60, 10) == []  # all held under their lease now


async def test_one_active_run_across_instances(two_pg_stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = two_pg_stores
    await a.schedules.insert_schedule(schedule(1))
    results = await asyncio.gather(
        a.schedules.insert_run(run(1, 1)),
        b.schedules.insert_run(run(2, 1)),
        a.schedules.insert_run(run(3, 1)),
        return_exceptions=True,
    )
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, ActiveRunConflict) for r in results if r is not None)
    assert await b.schedules.count_active_runs() == 1


async def test_one_running_task_per_thread_is_the_index(two_pg_stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = two_pg_stores
    t1, t2 = make_task(1, thread_id="thr_1"), make_task(2, thread_id="thr_1")
    await a.tasks.apply(Change(task=t1, expected_revision=None))
    await a.tasks.apply(Change(task=t2, expected_revision=None))  # two queued in one thread: fine
    await a.tasks.apply(Change(task=bump(t1, state="running"), expected_revision=1))
    with pytest.raises(Conflict) as info:
        await b.tasks.apply(Change(task=bump(t2, state="running"), expected_revision=1))
    assert info.value.code == Code.THREAD_BUSY and info.value.details["threadId"] == "thr_1"
    assert (await b.tasks.get_task(t2.id)).state == "queued"  # type: ignore[union-attr]


async def test_ids_page_in_byte_order_whatever_the_collation(
    two_pg_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, _ = two_pg_stores
    for task_id in ("tsk_b", "tsk_B", "tsk_a_1", "tsk_a1", "tsk_Z"):
        await a.tasks.apply(Change(task=make_task(1, id=task_id), expected_revision=None))
    page = await a.tasks.list_tasks(TaskQuery(limit=10))
    assert [t.id for t in page.items] == sorted(["tsk_b", "tsk_B", "tsk_a_1", "tsk_a1", "tsk_Z"])


async def test_a_newer_schema_is_refused_and_the_version_is_kept(pg_fresh_url: str) -> None:
    store = PostgresStore(pg_fresh_url)
    await store.start()
    assert await store.schema_version() == SCHEMA_VERSION
    await store.stop()
    await store.start()  # a second start migrates nothing
    await store.stop()
    with psycopg.connect(pg_fresh_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_version VALUES (%s, 0)", (SCHEMA_VERSION + 1,))
    with pytest.raises(StorageError, match="knows versions up to"):
        await store.start()


async def test_a_store_that_cannot_connect_names_no_password(tmp_path: Path) -> None:
    store = PostgresStore("postgresql://gw:hunter2-secret@127.0.0.1:1/gw")
    assert "hunter2" not in repr(store)
    store._db.connect_timeout_s = 1
    with pytest.raises(StorageError) as info:
        await store.start()
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value.details)


def test_store_urls_are_parsed_and_redacted(tmp_path: Path) -> None:
    assert parse_store_url("sqlite:////var/gw/x.db").path == Path("/var/gw/x.db")
    assert parse_store_url("postgresql://u:p@h:5432/db").kind == "postgresql"
    assert parse_store_url("postgres://u:p@h/db?sslmode=require").redacted == "postgres://u:***@h/db?sslmode=require"
    for bad in ("mysql://u:p@h/db", "sqlite://x.db", "postgresql://u:p@h:99999/db", "postgresql://u:p@h/"):
        with pytest.raises(StoreUrlError):
            parse_store_url(bad)
    default = load_config(None, {"GW_DATA_DIR": str(tmp_path)})
    assert default.store_url == f"sqlite:///{tmp_path}/gateway.db" and default.store_location.kind == "sqlite"
    assert default.instance.id.endswith("-8080")
    given = load_config(None, {"GW_STORE_URL": "postgresql://gw:pw-secret-1@db:5432/gw", "GW_INSTANCE_ID": "gw-2"})
    assert given.redacted()["store"]["url"] == "postgresql://gw:***@db:5432/gw" and given.instance.id == "gw-2"
    assert "pw-secret-1" not in repr(given)
    with pytest.raises(ConfigError) as info:
        load_config(None, {"GW_STORE_URL": "mysql://gw:pw-secret-1@db/gw"})
    assert "GW_STORE_URL" in str(info.value) and "pw-secret-1" not in str(info.value)


# ---------------------------------------------------------------------- retention (PostgreSQL only)


async def test_migration_3_fills_in_finished_at_of_the_terminal_tasks_already_there(
    pg_fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler_gateway.daemon.store import common
    from scheduler_gateway.daemon.store.postgres import migrations

    monkeypatch.setattr(migrations, "PG_MIGRATIONS", migrations.PG_MIGRATIONS[:2])
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", 2)
    old = PostgresStore(pg_fresh_url)
    await old.start()  # a database made before retention: tasks without the column
    await old.stop()
    nul = msgspec.Raw(b'{"text": "a\\u0000b"}')  # jsonb refuses \u0000: the fill-in must not
    tasks = [
        bump(make_task(1), state="succeeded", finished_at=T0),
        bump(make_task(2, payload=nul), state="dead", finished_at=T0 + 1),
        bump(make_task(3), state="succeeded", finished_at=T0 + 500),  # not due yet
        make_task(4),  # queued
    ]
    with psycopg.connect(pg_fresh_url, autocommit=True) as conn:
        for t in tasks:
            conn.execute(
                "INSERT INTO tasks (id, owner, kind, state, revision, priority, parent_id, run_id, thread_id,"
                " created_at, not_before, doc) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    *(t.id, t.owner, t.kind, t.state, t.revision, t.priority, t.parent_id, t.run_id, t.thread_id),
                    *(t.created_at, t.not_before, common.encode(t)),
                ),
            )
    monkeypatch.undo()
    store = PostgresStore(pg_fresh_url)
    await store.start()
    try:
        assert await store.schema_version() == SCHEMA_VERSION >= 3
        r = await store.retention.purge_tasks(T0 + 100, 10)
        assert r.purged["tasks"] == 2 and r.kept == 0 and r.cursor is None
        assert await store.tasks.get_task(tasks[0].id) is None and await store.tasks.get_task(tasks[1].id) is None
        assert (
            await store.tasks.get_task(tasks[2].id) is not None and await store.tasks.get_task(tasks[3].id) is not None
        )
    finally:
        await store.stop()


async def test_postgres_reports_its_tables_size_and_gives_no_space_back(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    try:
        for n in range(1, 30):
            t = make_task(n)
            await store.tasks.apply(Change(task=t, expected_revision=None))
            await store.tasks.apply(Change(task=bump(t, state="succeeded", finished_at=T0), expected_revision=1))
        size = await store.retention.store_size()
        assert size.size_bytes > 0 and 0 <= size.free_bytes <= size.size_bytes
        assert (await store.retention.purge_tasks(T0, 100)).purged["tasks"] == 29
        assert await store.retention.reclaim_space(1000) == 0  # autovacuum makes the space reusable in place
    finally:
        await store.stop()


async def test_a_purge_under_a_lost_fence_is_refused(pg_url: str) -> None:
    from scheduler_gateway.actors.duties import FenceToken, fenced
    from scheduler_gateway.daemon.store.postgres.db import FencedOut

    store = PostgresStore(pg_url)
    await store.start()
    try:
        t = make_task(1)
        await store.tasks.apply(Change(task=t, expected_revision=None))
        await store.tasks.apply(Change(task=bump(t, state="succeeded", finished_at=T0), expected_revision=1))
        with fenced(FenceToken(duty="leader", holder="gone", term=7)), pytest.raises(FencedOut):
            await store.retention.purge_tasks(T0, 10)
        assert await store.tasks.get_task(t.id) is not None
    finally:
        await store.stop()


async def test_a_purge_leaves_a_parent_that_a_child_insert_holds_and_keeps_it_once_the_child_is_in(
    pg_url: str,
) -> None:
    """A create under a parent locks the parent's row (FOR SHARE) before it inserts. A purge that read the
    parent's references before the child's commit deleted the parent once the lock was gone, leaving the
    child under nothing; it now skips a candidate a create holds, and keeps it when the child is in."""
    store = PostgresStore(pg_url)
    await store.start()
    try:
        parent = make_task(1)
        await store.tasks.apply(Change(task=parent, expected_revision=None))
        await store.tasks.apply(Change(task=bump(parent, state="succeeded", finished_at=T0), expected_revision=1))
        child_id = make_task(2).id
        async with await psycopg.AsyncConnection.connect(pg_url) as creator:
            # the store's insert of a child, held open between its parent check and its commit
            await creator.execute("SELECT state FROM tasks WHERE id = %s FOR SHARE", (parent.id,))
            await creator.execute("CREATE TEMP TABLE child AS SELECT * FROM tasks WHERE id = %s", (parent.id,))
            await creator.execute(
                "UPDATE child SET id = %s, parent_id = %s, state = 'queued', finished_at = NULL", (child_id, parent.id)
            )
            await creator.execute("INSERT INTO tasks SELECT * FROM child")
            result = await asyncio.wait_for(
                store.retention.purge_tasks(T0 + 100, 10), 5
            )  # the creator holds the parent
            assert result.purged.get("tasks", 0) == 0 and result.kept == 1, result
            await creator.commit()
        result = await store.retention.purge_tasks(T0 + 100, 10)
        assert result.purged.get("tasks", 0) == 0 and result.kept == 1, result  # its child names it now
        assert await store.tasks.get_task(parent.id) is not None
    finally:
        await store.stop()


async def test_a_rate_counts_each_start_on_the_database_clock(
    two_pg_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """Found by the simulation (two instances 4 s apart started two tasks in one instant under a rate of one per
    2 s): a start is counted when its claim commits, on the database's clock, whatever the deciding instance's
    clock said (``startedAt`` an hour behind, an hour ahead, or a claim decided before a long pause)."""
    from scheduler_gateway.actors.model.flow import KindSettings, Rate
    from scheduler_gateway.actors.model.records import ActorRef, AuditEntry, EventRecord

    from .test_store_contract import create
    from .test_store_contract_flow import claim

    a, b = two_pg_stores
    await a.kinds.put_kind(
        KindSettings(kind="echo", rate=Rate(limit=1, period_s=60.0)),
        AuditEntry(id="aud_rate", at=T0, action="kind.update", object_type="kind", object_id="echo", result="ok",
                   actor=ActorRef("user", "admin")),
        EventRecord(id="evt_rate", type="kind.updated", aggregate_type="kind", aggregate_id="echo", owner=None,
                    revision=None, at=T0, request_id=None),
    )  # fmt: skip
    behind, ahead = make_task(1), make_task(2)
    await a.tasks.apply_many([create(behind), create(ahead)])
    await a.tasks.apply(claim(behind, T0 - 3600.0))  # an instance whose clock is an hour behind
    with pytest.raises(Conflict) as info:
        await b.tasks.apply(claim(ahead, T0 + 3600.0))  # another's, an hour ahead, in the same minute of the database
    assert info.value.code == Code.LIMITED and info.value.details["rule"] == "kind_rate"


async def test_an_instance_frozen_inside_a_write_holds_the_others_up_only_until_its_session_is_ended(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An instance frozen between two statements of a write (a VM pause, SIGSTOP, a stalled loop) keeps its socket
    open, so PostgreSQL kept the transaction, and its locks, for as long as the freeze lasted: another instance's
    write of the same row waited with it (before issue 50, every instance's task writes did: they shared one
    lock). Its sessions now end an idle transaction after ``IDLE_IN_TRANSACTION_S`` (the instance's liveness
    bound: it is taken for dead by then), and the others go on; meanwhile a write of the held row waits at most
    the lock bound and answers a retryable STORAGE_ERROR (55P03), and a retry after the session ended commits."""
    monkeypatch.setattr(pg_db, "IDLE_IN_TRANSACTION_S", 1.0)
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.start()
    await b.start()
    locked, resume = asyncio.Event(), asyncio.Event()

    t1 = make_task(1, id="tsk_frozen_test_1")

    async def frozen_write() -> None:
        async with a._db.transaction() as conn:  # a's write of the task b creates too is under way
            await write_change(conn, ChangeRows.of(Change(task=t1, expected_revision=None, event=event_for(t1))))
            locked.set()
            await resume.wait()  # a freezes here
            await conn.execute("SELECT 1")

    try:
        write = asyncio.create_task(frozen_write())
        await locked.wait()
        began = time.monotonic()
        refusals: list[str] = []
        while True:  # b's write waits a bounded time for the row (55P03: retryable, nothing written), then again
            try:
                await asyncio.wait_for(b.tasks.apply(Change(task=t1, expected_revision=None, event=event_for(t1))), 8)
                break
            except StorageError as exc:
                refusals.append(str(exc.details.get("sqlState", "")))
            if time.monotonic() - began > 6:
                break
        assert set(refusals) <= {"55P03"} and time.monotonic() - began < 6, refusals
        resume.set()
        with pytest.raises(StorageError) as info:  # a goes on: its transaction is gone, and that write with it
            await write
        assert info.value.details == {"sqlState": "25P03"}  # idle_in_transaction_session_timeout
        assert [t.id for t in (await a.tasks.list_tasks(TaskQuery(limit=10))).items] == [t1.id]  # a new session
    finally:
        await a.stop()
        await b.stop()
