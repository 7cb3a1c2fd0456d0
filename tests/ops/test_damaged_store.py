"""A damaged store file (issue 22, point 1; CONTRACT 4, docs/OPERATIONS.md "A damaged store file").

Garbage written into the middle of ``gateway.db``, the file cut to half, a text file in its place, a schema
newer than this gatewayd knows: ``gatewayd run`` and ``gatewayd check`` exit 1 with one line naming the file and
the remedy (restore the file ``gatewayd backup`` wrote), no traceback, and the file is not written to (same
bytes, same mtime; ``run`` starts no embedded NATS server). ``gatewayd check`` runs SQLite's ``quick_check``
bounded in time, ``--deep`` the full ``integrity_check``; restoring the backup makes both green again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from scheduler_gateway.daemon import cli
from scheduler_gateway.daemon.check import check_main
from scheduler_gateway.daemon.config import load_config
from scheduler_gateway.daemon.nats.nats_server import free_port
from scheduler_gateway.daemon.store.backup import backup_store
from scheduler_gateway.daemon.store.integrity import inspect_sqlite_file
from scheduler_gateway.daemon.store.migrations import MIGRATIONS
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from tests.test_store_contract import create, make_task

from .helpers import BIN

TASKS = 400  # enough pages that "the middle" is a b-tree page of the tasks, history and audit tables


async def _filled_store(path: Path) -> None:
    store = SqliteStore(path)
    await store.start()
    try:
        for n in range(1, TASKS + 1):
            await store.tasks.apply(create(make_task(n, payload=msgspec.Raw(b'{"pad": "' + b"x" * 300 + b'"}'))))
    finally:
        await store.stop()


@pytest.fixture(scope="module")
def good_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store of the current schema with TASKS tasks, and its backup beside it (``backup.db``)."""
    path = tmp_path_factory.mktemp("good") / "gateway.db"
    asyncio.run(_filled_store(path))
    backup_store(path, path.with_name("backup.db"))
    return path


def garbage_in_the_middle(path: Path) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek((size // 2) // 4096 * 4096)
        f.write(os.urandom(2 * 4096))


def cut_to_half(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def text_in_its_place(path: Path) -> None:
    path.write_text("this is not a database\n" * 50)


def newer_schema(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, 0)", (len(MIGRATIONS) + 1,))
    db.close()


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "garbage in the middle": (garbage_in_the_middle, "is damaged"),
    "cut to half": (cut_to_half, "is damaged"),
    "a text file": (text_in_its_place, "not a SQLite database"),
    "a newer schema": (newer_schema, f"schema version {len(MIGRATIONS) + 1}, newer than this gatewayd knows"),
}


def _setup(tmp_path: Path, good_store: Path, damage: str) -> tuple[Path, Path]:
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    db = data_dir / "gateway.db"
    shutil.copyfile(good_store, db)
    DAMAGES[damage][0](db)
    config = tmp_path / "gw.toml"
    config.write_text(f'data_dir = "{data_dir}"\n[nats.embedded]\nport = {free_port()}\n[http]\nport = {free_port()}\n')
    return db, config


def _fingerprint(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GW_")}


def gatewayd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gatewayd"), *args], env=_env(), capture_output=True, text=True, timeout=60)


def _assert_one_line(text: str, db: Path, words: str) -> None:
    assert "Traceback" not in text, text
    (line,) = [ln for ln in text.splitlines() if str(db) in ln]
    assert words in line, line
    assert "gatewayd backup" in line and "docs/OPERATIONS.md" in line, line


def test_garbage_in_the_middle_stops_run_and_check_with_one_line_and_the_file_untouched(
    tmp_path: Path, good_store: Path
) -> None:
    """The real commands, as the issue found them: check said all was well, run died with a traceback."""
    db, config = _setup(tmp_path, good_store, "garbage in the middle")
    before = _fingerprint(db)
    check = gatewayd("check", "--config", str(config))
    assert check.returncode == 1, check.stdout + check.stderr
    store_line = next(ln for ln in check.stdout.splitlines() if ln.split()[1:2] == ["store"])
    assert store_line.startswith("FAIL"), check.stdout
    _assert_one_line(check.stdout + check.stderr, db, "is damaged (")

    run = gatewayd("run", "--config", str(config))
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1, run.stderr  # one line, and only that
    _assert_one_line(run.stderr, db, "is damaged")
    assert _fingerprint(db) == before, "the damaged file was written to"
    assert not (db.parent / "nats-server.pid").exists() and not (db.parent / "nats.json").exists()
    assert not db.with_name("gateway.db-wal").exists()

    # the remedy as docs/OPERATIONS.md says it: the backup in its place, no -wal/-shm beside it
    for leftover in (db, db.with_name("gateway.db-wal"), db.with_name("gateway.db-shm")):
        leftover.unlink(missing_ok=True)
    shutil.copyfile(good_store.with_name("backup.db"), db)
    deep = gatewayd("check", "--deep", "--config", str(config))
    assert deep.returncode == 0, deep.stdout + deep.stderr
    assert "integrity_check ok" in deep.stdout, deep.stdout


@pytest.mark.parametrize("damage", ["cut to half", "a text file", "a newer schema"])
def test_every_damage_is_refused_by_check_and_run_the_same_way(
    tmp_path: Path, good_store: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process (the same functions the commands call, without a process start each)."""
    db, config = _setup(tmp_path, good_store, damage)
    before = _fingerprint(db)
    words = DAMAGES[damage][1]
    assert check_main(config, env=_env()) == 1
    out = capsys.readouterr()
    _assert_one_line(out.out + out.err, db, words)

    loaded = load_config(config, _env())
    assert asyncio.run(cli._run(loaded)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    _assert_one_line(err, db, words)
    assert _fingerprint(db) == before
    assert not (db.parent / "nats-server.pid").exists()


def test_quick_check_is_bounded_and_deep_is_the_full_check(good_store: Path) -> None:
    whole = inspect_sqlite_file(good_store)
    assert whole.ok and whole.complete and "quick_check ok" in whole.note
    cut_short = inspect_sqlite_file(good_store, budget_s=0.0)  # a file too large for its budget
    assert cut_short.ok and not cut_short.complete, cut_short
    assert "gatewayd check --deep" in cut_short.note
    deep = inspect_sqlite_file(good_store, deep=True, budget_s=0.0)  # --deep has no bound
    assert deep.ok and deep.complete and "integrity_check ok" in deep.note
