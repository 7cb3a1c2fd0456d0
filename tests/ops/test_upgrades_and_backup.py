"""Upgrades and data (issue 6): a store created at any earlier schema version migrates on start to the
schema a fresh store has, keeping its rows; ``gatewayd backup --to FILE`` copies the store consistently
while the daemon runs, and the copy restores into a working daemon (the README's procedure)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.daemon.store.backup import BackupError, backup_store
from scheduler_gateway.daemon.store.sqlite import MIGRATIONS, SqliteStore
from tests.e2e.procs import Daemon
from tests.test_store_contract import create, make_task

from .helpers import BIN

# --------------------------------------------------------------------------- migrations


def schema_of(path: Path) -> set[tuple[str, str, str]]:
    """(type, name, sql) of every table, index and trigger; what a migration must end up with."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT type, name, coalesce(sql, '') FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        out = {(t, n, " ".join(s.split())) for t, n, s in rows}
    db.close()
    return out


def versions_of(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        out = [int(r[0]) for r in db.execute("SELECT version FROM schema_version ORDER BY version")]
    db.close()
    return out


async def full_store_with_data(path: Path) -> None:
    """A store at the current version holding a task (with its history, audit, outbox) and a principal."""
    store = SqliteStore(path)
    await store.start()
    try:
        await store.tasks.apply(create(make_task(1, payload=msgspec.Raw(b'{"kept": true}'))))
        await store.nodes.put_principal(Principal(token_hash="h" * 64, user="alice", role="user", created_at=1.0))
    finally:
        await store.stop()


def old_store(path: Path, version: int, rows_from: Path) -> int:
    """A database as a gatewayd of schema ``version`` left it: ``MIGRATIONS[:version]`` applied by hand,
    with the rows of ``rows_from`` that fit its tables. Returns how many rows were copied."""
    db = sqlite3.connect(path, isolation_level=None)
    copied = 0
    try:
        db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for n, statements in enumerate(MIGRATIONS[:version], start=1):
            for sql in statements:
                db.execute(sql)
            db.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (n, 0.0))
        db.execute("ATTACH DATABASE ? AS src", (str(rows_from),))
        tables = [r[0] for r in db.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table == "schema_version" or table.startswith("sqlite_"):
                continue
            columns = [r[1] for r in db.execute(f"PRAGMA main.table_info({table})")]
            names = ", ".join(columns)
            copied += db.execute(f"INSERT INTO main.{table} ({names}) SELECT {names} FROM src.{table}").rowcount
    finally:
        db.close()
    return copied


@pytest.mark.parametrize("version", range(len(MIGRATIONS)), ids=lambda v: f"from-v{v}")
async def test_a_store_of_every_earlier_schema_version_migrates_on_start(tmp_path: Path, version: int) -> None:
    fresh = tmp_path / "fresh.db"
    await full_store_with_data(fresh)
    path = tmp_path / "old.db"
    copied = old_store(path, version, fresh)
    assert versions_of(path) == list(range(1, version + 1))
    assert (copied > 0) == (version >= 1)

    store = SqliteStore(path)
    await store.start()
    try:
        if version >= 1:  # the rows written by the older version are all still there
            task = await store.tasks.get_task(make_task(1).id)
            assert task is not None and bytes(task.payload) == b'{"kept": true}'
            assert await store.nodes.get_principal("h" * 64) is not None
        # and the migrated store takes new writes
        await store.tasks.apply(create(make_task(2)))
        assert await store.tasks.get_task(make_task(2).id) is not None
    finally:
        await store.stop()
    assert versions_of(path) == list(range(1, len(MIGRATIONS) + 1))
    assert schema_of(path) == schema_of(fresh)


async def test_migration_16_fills_in_finished_at_of_the_terminal_tasks_already_there(tmp_path: Path) -> None:
    """Until migration 16 ``tasks.finished_at`` was generated from the document; it is now a column the writes
    set, so the migration reads it out of the terminal tasks' documents once, and retention finds them by it."""
    fresh = tmp_path / "fresh.db"
    store = SqliteStore(fresh)
    await store.start()
    try:
        await store.tasks.apply(create(make_task(1, state="succeeded", finished_at=1_700_000_100.5)))
        await store.tasks.apply(create(make_task(2, state="failed", finished_at=1_700_000_050.25)))
        await store.tasks.apply(create(make_task(3)))  # queued: no finish
    finally:
        await store.stop()
    path = tmp_path / "old.db"
    old_store(path, 15, fresh)
    with sqlite3.connect(path) as db:  # at version 15 the column is generated: nothing was copied into it
        assert [r[0] for r in db.execute("SELECT finished_at FROM tasks ORDER BY id")] == [
            1_700_000_100.5, 1_700_000_050.25, None,
        ]  # fmt: skip
    db.close()

    store = SqliteStore(path)
    await store.start()
    try:
        purged = await store.retention.purge_tasks(1_700_000_060.0, 100)
        assert purged.purged["tasks"] == 1  # the failed task, due by the finish read out of its document
        assert await store.tasks.get_task(make_task(2).id) is None
        assert await store.tasks.get_task(make_task(1).id) is not None
    finally:
        await store.stop()
    with sqlite3.connect(path) as db:
        rows = list(db.execute("SELECT id, finished_at FROM tasks ORDER BY id"))
        generated = db.execute("SELECT count(*) FROM pragma_table_xinfo('tasks') WHERE hidden != 0").fetchone()[0]
    db.close()
    assert rows == [(make_task(1).id, 1_700_000_100.5), (make_task(3).id, None)]
    assert generated == 0  # a plain column now


# --------------------------------------------------------------------------- backup


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_backup_copies_a_store_that_is_being_written(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "gateway.db")
    await store.start()
    try:
        for n in range(1, 51):
            await store.tasks.apply(create(make_task(n)))
        writing = True

        async def keep_writing() -> int:
            n = 1000
            while writing:
                await store.tasks.apply(create(make_task(n)))
                n += 1
            return n - 1000

        writer = asyncio.create_task(keep_writing())
        await asyncio.sleep(0.05)
        result = await asyncio.to_thread(backup_store, tmp_path / "gateway.db", tmp_path / "backup.db")
        writing = False
        written_meanwhile = await writer
    finally:
        await store.stop()
    assert written_meanwhile > 0
    assert result.schema_version == len(MIGRATIONS) and result.tasks >= 50
    assert mode_of(tmp_path / "backup.db") == 0o600
    # one self-contained file: no -wal beside it is needed (rollback journal), and it passes the check
    with sqlite3.connect(tmp_path / "backup.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM tasks").fetchone()[0] == result.tasks
    db.close()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".backup.db.")]  # no temporary file left


def test_backup_refuses_to_overwrite_the_live_store_and_needs_one(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match="does not exist"):
        backup_store(tmp_path / "gateway.db", tmp_path / "b.db")
    sqlite3.connect(tmp_path / "gateway.db").close()
    with pytest.raises(BackupError, match="live store itself"):
        backup_store(tmp_path / "gateway.db", tmp_path / "gateway.db")
    with pytest.raises(BackupError, match="live store itself"):
        backup_store(tmp_path / "gateway.db", tmp_path / "." / "gateway.db-wal")
    with pytest.raises(BackupError, match="is a directory"):
        backup_store(tmp_path / "gateway.db", tmp_path)


def _api(daemon: Daemon, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        daemon.base + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {daemon.token}", "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_gatewayd_backup_of_a_running_daemon_restores_into_a_working_daemon(tmp_path: Path) -> None:
    daemon = Daemon(data_dir=tmp_path / "var")
    restored = Daemon(data_dir=tmp_path / "restored")
    daemon.start()
    try:
        before = [_api(daemon, "POST", "/api/tasks", {"kind": "echo", "payload": i})["id"] for i in range(20)]
        # tasks keep being created while the backup runs: it must not block them, nor they it
        stop = threading.Event()
        during: list[str] = []

        def create_more() -> None:
            while not stop.is_set():
                during.append(_api(daemon, "POST", "/api/tasks", {"kind": "echo", "payload": "during"})["id"])

        creator = threading.Thread(target=create_more)
        creator.start()
        try:
            time.sleep(0.2)
            env = {**os.environ, "GW_DATA_DIR": str(daemon.data_dir)}
            env.pop("GW_NATS_URL", None)
            done = subprocess.run(
                [str(BIN / "gatewayd"), "backup", "--to", str(tmp_path / "backup.db")],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            time.sleep(0.2)
        finally:
            stop.set()
            creator.join(30)
        assert done.returncode == 0, done.stderr
        line = done.stdout.strip()
        assert line.startswith("gatewayd backup: ") and f"schema version {len(MIGRATIONS)}" in line, line
        assert len(during) > 2  # the daemon kept taking work during the backup
    finally:
        daemon.stop()
        daemon.kill_orphan_nats()

    # restore as the README says: the file becomes <data_dir>/gateway.db, with no -wal/-shm beside it
    restored.data_dir.mkdir()
    shutil.copyfile(tmp_path / "backup.db", restored.data_dir / "gateway.db")
    for leftover in ("gateway.db-wal", "gateway.db-shm"):
        assert not (restored.data_dir / leftover).exists()
    restored.start()
    try:
        for task_id in before:  # everything committed before the backup started is there
            assert _api(restored, "GET", f"/api/tasks/{task_id}")["id"] == task_id
        listed = _api(restored, "GET", "/api/tasks?limit=500")["items"]
        assert 20 <= len(listed) <= 20 + len(during)
    finally:
        restored.stop()
        restored.kill_orphan_nats()


def test_gatewayd_backup_reports_a_missing_store(tmp_path: Path) -> None:
    env = {**os.environ, "GW_DATA_DIR": str(tmp_path / "nothing-here")}
    done = subprocess.run(
        [str(BIN / "gatewayd"), "backup", "--to", str(tmp_path / "b.db")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and "does not exist" in done.stderr and done.stdout == ""
