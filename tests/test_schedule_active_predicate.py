"""One meaning of "an active run" (issue 49 point 11b, seed 000 pitfall 5): ``ACTIVE_RUN_STATUSES`` is the fast
path's idea of it; the partial unique index ``uq_scheduled_run_active`` is the arbiter; the index
``scheduled_runs_active_task`` serves retention's "an active run names this task"; the queries of both stores
and both retention modules are built from ``ACTIVE_RUN_SQL``. A drift between any two makes them disagree, so:

- every index over ``scheduled_runs`` with a status predicate, in the migration texts of both stores and in the
  databases themselves (SQLite on a real file, a real PostgreSQL), has exactly that predicate;
- per run status, every store (and the memory store that mirrors them) answers the same thing in every place
  that asks: the fast path (``has_active_run``, ``count_active_runs``, ``active_runs``), the arbiter (a second
  active run refused), and retention (a due task kept while a run naming it is active; old runs purged only
  when terminal)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.schedule import ACTIVE_RUN_STATUSES, RUN_STATUSES
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.actors.schedule_ports import ActiveRunConflict
from scheduler_gateway.daemon.store import retention as sqlite_retention
from scheduler_gateway.daemon.store import schedule_rows
from scheduler_gateway.daemon.store.migrations import MIGRATIONS
from scheduler_gateway.daemon.store.postgres import retention as pg_retention
from scheduler_gateway.daemon.store.postgres.migrations import PG_MIGRATIONS
from scheduler_gateway.daemon.store.sqlite import SqliteStore

from .test_schedule_store import T0, rid, run, schedule, sid, store  # noqa: F401  (the fixture)

_RUN_INDEX = re.compile(
    r"CREATE (?:UNIQUE )?INDEX (\w+) ON scheduled_runs \([^)]*\)\s+WHERE status IN \(([^)]*)\)", re.IGNORECASE
)
INDEXES = {"uq_scheduled_run_active", "scheduled_runs_active_task"}


def _predicates(texts: list[str]) -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for text in texts:
        for name, values in _RUN_INDEX.findall(" ".join(text.split())):
            found[name] = tuple(v.strip().strip("'") for v in values.split(","))
    return found


@pytest.mark.parametrize("migrations", [MIGRATIONS, PG_MIGRATIONS], ids=["sqlite", "postgres"])
def test_every_migration_copy_is_the_constant(migrations: tuple[tuple[str, ...], ...]) -> None:
    found = _predicates([sql for step in migrations for sql in step])
    assert found == dict.fromkeys(INDEXES, ACTIVE_RUN_STATUSES)


def test_the_queries_are_built_from_the_constant() -> None:
    assert "(" + ", ".join(f"'{s}'" for s in ACTIVE_RUN_STATUSES) + ")" == schedule_rows.ACTIVE_RUN_SQL
    for text in (schedule_rows._ACTIVE_SQL, sqlite_retention._ACTIVE_RUN_SQL, pg_retention._ACTIVE_RUN_SQL):
        assert text == schedule_rows.ACTIVE_RUN_SQL
    assert f"r.status IN {schedule_rows.ACTIVE_RUN_SQL}" in sqlite_retention._SQL_DUE_TASKS
    assert f"r.status IN {schedule_rows.ACTIVE_RUN_SQL}" in pg_retention._REFERENCED


async def test_the_sqlite_database_holds_the_constant(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "gw.db")
    await s.start()
    await s.stop()
    with sqlite3.connect(tmp_path / "gw.db") as conn:
        texts = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE tbl_name = 'scheduled_runs'") if r[0]]
    assert _predicates(texts) == dict.fromkeys(INDEXES, ACTIVE_RUN_STATUSES)


async def test_the_postgres_database_holds_the_constant(pg_url: str) -> None:
    import psycopg

    from scheduler_gateway.daemon.store.postgres import PostgresStore

    s = PostgresStore(pg_url)
    await s.start()
    await s.stop()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT indexname, pg_get_expr(i.indpred, i.indrelid) FROM pg_indexes x"
            " JOIN pg_class c ON c.relname = x.indexname JOIN pg_index i ON i.indexrelid = c.oid"
            " WHERE x.tablename = 'scheduled_runs' AND i.indpred IS NOT NULL"
        )
        rows = await cur.fetchall()
    # PostgreSQL prints the predicate back as status = ANY (ARRAY['queued'::text, 'running'::text])
    found = {name: tuple(re.findall(r"'([^']*)'", predicate)) for name, predicate in rows}
    assert found == dict.fromkeys(INDEXES, ACTIVE_RUN_STATUSES)


def _task(n: int) -> Task:
    return Task(
        id=f"tsk_{n:032x}",
        owner="alice",
        kind="echo",
        state="succeeded",
        revision=1,
        attempt_id="att_1",
        run_id="run_1",
        not_before=T0,
        created_at=T0,
        updated_at=T0,
        finished_at=T0,
    )


@pytest.mark.parametrize("status", RUN_STATUSES)
async def test_every_place_agrees_on_each_status(store: Any, status: str) -> None:  # noqa: F811
    active = status in ACTIVE_RUN_STATUSES
    await store.schedules.insert_schedule(schedule(1))
    await store.tasks.apply(Change(task=_task(1), expected_revision=None))
    await store.schedules.insert_run(run(1, 1, status, task_id=_task(1).id))
    # the fast path
    assert await store.schedules.has_active_run(sid(1)) is active
    assert await store.schedules.count_active_runs() == int(active)
    assert [r.id for r in await store.schedules.active_runs()] == ([rid(1)] if active else [])
    # the arbiter: a second active run of the schedule is refused exactly while this one is active
    second = run(2, 1, "queued")
    if active:
        with pytest.raises(ActiveRunConflict):
            await store.schedules.insert_run(second)
    else:
        await store.schedules.insert_run(second)
    # retention: a due task is kept while an active run names it
    result = await store.retention.purge_tasks(T0 + 1, 10)
    assert (result.purged.get("tasks", 0), result.kept) == ((0, 1) if active else (1, 0))
    # retention: runs past the kept ones are purged only when terminal
    await store.schedules.insert_run(run(3, 1, "succeeded"))
    await store.schedules.insert_run(run(4, 1, "succeeded"))
    await store.retention.purge_runs(1, 100)
    left = {r.id for r in (await store.schedules.list_runs(sid(1), 100, None)).items}
    assert (rid(1) in left) is active
