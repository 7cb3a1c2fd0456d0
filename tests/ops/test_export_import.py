"""``gatewayd export`` / ``gatewayd import`` (store/transfer.py): a SQLite deployment moved into PostgreSQL reads
back the same through the PostgreSQL store; a non-empty target is refused; the commands run end to end."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import msgspec
import psycopg
import pytest

from scheduler_gateway.actors.model.callbacks import CallbackDelivery
from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.records import DeadLetter
from scheduler_gateway.actors.model.schedule import Thread
from scheduler_gateway.actors.ports import AuditQuery, IdempotencyRecord, Principal, TaskSearch
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.daemon.store.transfer import NOT_MOVED, TABLES, TransferError, export_sqlite, import_postgres
from tests.ops.helpers import BIN
from tests.test_schedule_store import run, schedule, sid
from tests.test_store_contract import T0, bump, create, make_task, update
from tests.test_store_contract_artifacts import LIMITS, audit_event, rec
from tests.test_store_contract_flow import audit as kind_audit
from tests.test_store_contract_flow import claim as limited_claim
from tests.test_store_contract_flow import event as kind_event

KEY = IdempotencyRecord(
    owner="alice", key="k1", operation="create", body_hash="h", task_id=make_task(1).id, created_at=T0
)
PRINCIPAL = Principal(token_hash="th_1", user="alice", role="user", created_at=T0)
THREAD = Thread(id="thr_1", owner="alice", title="lane", created_at=T0)
PAUSED = KindSettings(kind="sleep", paused=True, concurrency=3)
RATED = KindSettings(kind="rated", rate=Rate(limit=1, period_s=3600))


async def fill(path: Path) -> dict[str, object]:
    """A SQLite store with tasks in several states and everything around them; what it holds."""
    store = SqliteStore(path)
    await store.start()
    try:
        queued = make_task(1, labels={"team": "red"})
        await store.tasks.apply(create(queued, idempotency=KEY))
        done = make_task(2, callback_url="https://example.test/cb")
        await store.tasks.apply(create(done))
        finished = bump(done, state="succeeded", finished_at=T0 + 9)
        delivery = CallbackDelivery(
            id="cbd_1",
            task_id=done.id,
            owner="alice",
            revision=finished.revision,
            url="https://example.test/cb",
            body=msgspec.Raw(b'{"ok": true}'),
            due_at=T0,
            created_at=T0,
        )
        await store.tasks.apply(msgspec.structs.replace(update(done, finished, "complete"), callback=delivery))
        dead = make_task(3)
        await store.tasks.apply(create(dead))
        letter = DeadLetter(
            dead_letter_id="dl_1",
            task_id=dead.id,
            original_task_id=dead.id,
            owner="alice",
            dead_reason="boom",
            first_dead_at=T0,
            last_dead_at=T0,
        )
        dead2 = bump(dead, state="dead", finished_at=T0 + 5)
        await store.tasks.apply(msgspec.structs.replace(update(dead, dead2, "die"), dead_letter=letter))
        running = make_task(4, thread_id=THREAD.id)
        await store.schedules.put_thread(THREAD)
        await store.tasks.apply(create(running))
        running2 = bump(running, state="running", started_at=T0 + 1, lease_expires_at=T0 + 61)
        await store.tasks.apply(update(running, running2, "lease"))
        # what running work leaves: an artifact of the running task, and the settings and starts of a kind
        artifact = rec(running2, "report.txt")
        await store.artifacts.record_artifact(
            artifact, *audit_event(artifact), task_revision=running2.revision, limits=LIMITS
        )
        await store.kinds.put_kind(PAUSED, kind_audit("sleep", 1), kind_event("sleep", 1))
        await store.kinds.put_kind(RATED, kind_audit("rated", 1), kind_event("rated", 1))
        started = make_task(5, kind="rated")
        await store.tasks.apply(create(started))
        assert await store.tasks.apply_many([limited_claim(started, T0 + 2)]) == [None]
        await store.schedules.insert_schedule(schedule(1))
        await store.schedules.insert_run(run(1, 1))
        await store.nodes.put_principal(PRINCIPAL)
        return {"tasks": [queued, finished, dead2, running2], "letter": letter, "artifact": artifact}
    finally:
        await store.stop()


async def test_every_table_of_the_sqlite_store_is_moved_or_named_as_not_moved(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "gateway.db")
    await store.start()
    await store.stop()
    with sqlite3.connect(tmp_path / "gateway.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    moved = {t for t, _ in TABLES}
    assert not moved & NOT_MOVED
    assert {t for t in tables if not t.startswith("sqlite_")} == moved | NOT_MOVED


async def test_export_then_import_reads_back_the_same(tmp_path: Path, pg_url: str) -> None:
    db = tmp_path / "gateway.db"
    held = await fill(db)
    sqlite = SqliteStore(db)
    await sqlite.start()
    try:
        before_history = {t.id: (await sqlite.tasks.history(t.id)).items for t in held["tasks"]}  # type: ignore[attr-defined]
        before_audit = (await sqlite.tasks.list_audit(AuditQuery(limit=500))).items
        before_schedule = await sqlite.schedules.get_schedule_record(sid(1))
        before_runs = (await sqlite.schedules.list_runs(sid(1), 50, None)).items
    finally:
        await sqlite.stop()

    export = tmp_path / "export.jsonl"
    counts = export_sqlite(db, export)
    assert counts["tasks"] == 5 and counts["dead_letters"] == 1 and counts["callback_deliveries"] == 1
    assert oct(export.stat().st_mode & 0o777) == "0o600"
    header = json.loads(export.read_text().splitlines()[0])
    assert header["format"] and header["schemaVersion"] and header["exportedAt"].endswith("Z")
    assert await import_postgres(pg_url, export) == {t: n for t, n in counts.items() if n}

    pg = PostgresStore(pg_url, clock=lambda: T0 + 3)  # the rate's window is judged on the store's clock
    await pg.start()
    try:
        for task in held["tasks"]:  # type: ignore[attr-defined]
            assert await pg.tasks.get_task(task.id) == task
            assert (await pg.tasks.history(task.id)).items == before_history[task.id]
        assert (await pg.tasks.list_audit(AuditQuery(limit=500))).items == before_audit
        assert await pg.letters.get_dead_letter("dl_1") == held["letter"]
        # the console's label filter finds the imported task (its labels are written with the import's rows)
        labelled = await pg.search.search_tasks(TaskSearch(label=("team", "red")))
        assert [t.id for t in labelled.items] == [make_task(1).id]
        assert await pg.tasks.get_idempotency("alice", "k1") == KEY
        assert await pg.nodes.get_principal("th_1") == PRINCIPAL
        assert await pg.schedules.get_thread(THREAD.id) == THREAD
        assert await pg.schedules.get_schedule_record(sid(1)) == before_schedule
        assert (await pg.schedules.list_runs(sid(1), 50, None)).items == before_runs
        outbox = await pg.tasks.outbox_batch(100)
        assert len(outbox) == counts["outbox"] > 0
        # a paused kind stays paused, its limits and its rate's starts hold: the next start of the kind
        # within the hour is refused as it was before the move
        assert {k.kind: k for k in await pg.kinds.list_kinds()} == {"sleep": PAUSED, "rated": RATED}
        again = make_task(6, kind="rated")
        await pg.tasks.apply(create(again))
        [refusal] = await pg.tasks.apply_many([limited_claim(again, T0 + 3)])
        assert refusal is not None and refusal.details["rule"] == "kind_rate"
        # the running task's artifact is still listed, counted and found by the orphan sweep
        artifact = held["artifact"]
        assert await pg.artifacts.list_artifacts(artifact.task_id) == [artifact]  # type: ignore[attr-defined]
        assert await pg.artifacts.artifact_usage(artifact.task_id) == (1, artifact.size)  # type: ignore[attr-defined]
        assert await pg.artifacts.known_uploads([artifact.upload]) == {artifact.upload}  # type: ignore[attr-defined]
    finally:
        await pg.stop()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT deadline_at, finished_at FROM tasks WHERE id = ANY(%s) ORDER BY id",
            ([t.id for t in held["tasks"]],),  # type: ignore[attr-defined]
        )
        assert await cur.fetchall() == [(None, None), (None, T0 + 9), (None, T0 + 5), (T0 + 1 + 3600.0, None)]
        # the sequences go on past the imported numbers
        cur = await conn.execute("SELECT nextval(pg_get_serial_sequence('audit', 'seq'))")
        row = await cur.fetchone()
        assert row is not None and row[0] > len(before_audit)

    # a second import into the now non-empty store is refused, and writes nothing
    with pytest.raises(TransferError, match="not empty"):
        await import_postgres(pg_url, export)


def test_gatewayd_export_and_import_end_to_end(tmp_path: Path, pg_url: str) -> None:
    import asyncio

    data = tmp_path / "data"
    data.mkdir()
    asyncio.run(fill(data / "gateway.db"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
    export = tmp_path / "out.jsonl"
    done = subprocess.run(
        [str(BIN / "gatewayd"), "export", "--to", str(export)],
        env={**env, "GW_DATA_DIR": str(data)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gatewayd export: ") and "5 tasks, " in done.stdout and "2 kinds, " in done.stdout

    pg_env = {**env, "GW_DATA_DIR": str(tmp_path / "pg-data"), "GW_STORE_URL": pg_url}
    password = psycopg.conninfo.conninfo_to_dict(pg_url).get("password")
    done = subprocess.run(
        [str(BIN / "gatewayd"), "import", "--from", str(export)], env=pg_env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "5 tasks" in done.stdout and "1 artifacts" in done.stdout and "1 principals" in done.stdout
    again = subprocess.run(
        [str(BIN / "gatewayd"), "import", "--from", str(export)], env=pg_env, capture_output=True, text=True
    )
    assert again.returncode == 1 and "not empty" in again.stderr and "nothing was imported" in again.stderr
    if password:
        assert str(password) not in done.stdout + again.stdout + again.stderr

    # the wrong way round is refused with a clear message
    wrong = subprocess.run(
        [str(BIN / "gatewayd"), "import", "--from", str(export)],
        env={**env, "GW_DATA_DIR": str(data)},
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 1 and "PostgreSQL" in wrong.stderr
