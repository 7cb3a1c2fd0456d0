"""No callback secret reaches an export (issue 49 point 11d, docs/OPERATIONS.md, Moving from SQLite to PostgreSQL):
``gatewayd export`` leaves a task's own ``callbackSecret`` out of the task, its pending delivery and its callback
dead letter, keeps everything else byte-exact (a payload with a key named like the secret included), and names the
tasks on the end line; import takes them in without the secret and says so (the callbacks are then signed with
``[callbacks] secret``, or cannot be signed when none is set), on a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import msgspec

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDelivery
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.daemon.store.transfer import export_sqlite, import_postgres
from tests.ops.helpers import BIN
from tests.test_store_contract import T0, bump, create, make_task, update

SECRET = "s3cr3t-that-must-not-leave"
PAYLOAD = b'{"callback_secret": "user data, not a secret", "n": 1.50}'


async def fill(path: Path) -> dict[str, object]:
    store = SqliteStore(path)
    await store.start()
    try:
        signed = make_task(
            1, callback_url="https://example.test/cb", callback_secret=SECRET, payload=msgspec.Raw(PAYLOAD)
        )
        await store.tasks.apply(create(signed))
        done = bump(signed, state="succeeded", finished_at=T0 + 9)
        delivery = CallbackDelivery(
            id="cbd_1",
            task_id=signed.id,
            owner="alice",
            revision=done.revision,
            url="https://example.test/cb",
            body=msgspec.Raw(b'{"ok": true}'),
            due_at=T0,
            created_at=T0,
            secret=SECRET,
        )
        await store.tasks.apply(msgspec.structs.replace(update(signed, done, "complete"), callback=delivery))
        # a second delivery of the task that failed for good: its callback dead letter carries it, secret included
        failed = msgspec.structs.replace(delivery, id="cbd_2")
        await store.tasks.apply(msgspec.structs.replace(update(done, bump(done), "touch"), callback=failed))
        letter = CallbackDeadLetter(
            id="cdl_1",
            task_id=signed.id,
            owner="alice",
            callback_url="https://example.test/cb",
            last_error="HTTP 500",
            attempt_count=3,
            created_at=T0,
            delivery=failed,
        )
        audit = AuditEntry(
            id="aud_cdl",
            at=T0,
            action="callback_dead",
            object_type="task",
            object_id=signed.id,
            result="ok",
            actor=ActorRef("system", "callback-sender"),
        )
        await store.callbacks.dead_letter_callback("cbd_2", letter, audit)
        plain = make_task(2, callback_url="https://example.test/cb")  # signed with [callbacks] secret already
        await store.tasks.apply(create(plain))
        return {"signed": bump(done), "plain": plain}
    finally:
        await store.stop()


async def test_the_export_carries_no_secret_and_import_takes_the_rest(tmp_path: Path, pg_url: str) -> None:
    db = tmp_path / "gateway.db"
    held = await fill(db)
    export = tmp_path / "export.jsonl"
    export_sqlite(db, export)
    text = export.read_text()
    assert SECRET not in text
    end = json.loads(text.splitlines()[-1])
    signed = held["signed"]
    assert end["callbackSecretsLeftOut"] == [signed.id]  # type: ignore[attr-defined]
    await import_postgres(pg_url, export)
    pg = PostgresStore(pg_url)
    await pg.start()
    try:
        got = await pg.tasks.get_task(signed.id)  # type: ignore[attr-defined]
        assert got == msgspec.structs.replace(signed, callback_secret=None)
        assert bytes(got.payload) == PAYLOAD  # byte-exact, its own "callback_secret" key untouched
        assert await pg.tasks.get_task(held["plain"].id) == held["plain"]  # type: ignore[attr-defined]
        (delivery,) = await pg.callbacks.pending_callbacks(10)
        assert delivery.secret is None and bytes(delivery.body) == b'{"ok": true}'
        dead = await pg.callbacks.get_callback_dead_letter("cdl_1")
        assert dead is not None and dead.delivery.secret is None and dead.last_error == "HTTP 500"
    finally:
        await pg.stop()


def test_gatewayd_import_warns_about_the_tasks_left_without_their_secret(tmp_path: Path, pg_url: str) -> None:
    import asyncio

    data = tmp_path / "data"
    data.mkdir()
    held = asyncio.run(fill(data / "gateway.db"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
    export = tmp_path / "out.jsonl"
    done = subprocess.run(
        [str(BIN / "gatewayd"), "export", "--to", str(export)],
        env={**env, "GW_DATA_DIR": str(data)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert SECRET not in export.read_text()
    pg_env = {**env, "GW_DATA_DIR": str(tmp_path / "pg-data"), "GW_STORE_URL": pg_url}
    done = subprocess.run(
        [str(BIN / "gatewayd"), "import", "--from", str(export)], env=pg_env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    warning = done.stderr
    assert "1 task(s) had their own callbackSecret" in warning and held["signed"].id in warning  # type: ignore[attr-defined]
    assert "[callbacks] secret is not set" in warning and "dead-lettered" in warning
    assert SECRET not in done.stdout + done.stderr
