"""``gatewayd export`` / ``import`` move workflows from SQLite to PostgreSQL (store/transfer.py): the workflow's
row (without its callback secret, named on the end line), its tasks with their workflow, the edges with their
outcomes, the counters and the notices not yet handled; on PostgreSQL the workflow goes on as it would have on
SQLite (the next settle releases the join, a new notice gets a number above the imported ones)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from scheduler_gateway.actors.ports import TaskQuery
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.daemon.store.transfer import export_sqlite, import_postgres
from tests.test_store_contract import T0, bump, create, leaving, tid, update
from tests.test_store_contract_workflows import WF, edges_of, record, wf_audit, wf_event, wf_task

SECRET = "wf-secret-never-exported"


def settle(t: object) -> object:
    new = bump(t, state="succeeded", finished_at=T0 + 100, updated_at=T0 + 100)  # type: ignore[arg-type]
    return msgspec.structs.replace(leaving(update(t, new, "settle"), "queued"), edge_effect="settle")  # type: ignore[arg-type]


async def test_a_workflow_moves_to_postgresql_and_goes_on_there(tmp_path: Path, pg_url: str) -> None:
    a, b = wf_task(1, "a"), wf_task(2, "b")
    join = wf_task(3, "join", (("a", "succeeded"), ("b", "succeeded")))
    db = tmp_path / "gateway.db"
    sqlite = SqliteStore(db)
    await sqlite.start()
    try:
        wf = record(callback_url="https://example.test/wf", callback_secret=SECRET, max_parallel=2)
        await sqlite.workflows.create_workflow(
            wf, [create(t) for t in (a, b, join)], edges_of([a, b, join]), audit=wf_audit(), event=wf_event(),
            idempotency=None,
        )  # fmt: skip
        await sqlite.tasks.apply(settle(a))  # type: ignore[arg-type]
        await sqlite.workflows.create_workflow(  # a second one, finished: its notice waits for the releaser
            record("wfl_00000000000000000000000002"), [create(wf_task(7, "x", wf="wfl_00000000000000000000000002"))],
            [], audit=wf_audit("wfl_00000000000000000000000002"), event=wf_event("wfl_00000000000000000000000002"),
            idempotency=None,
        )  # fmt: skip
        await sqlite.tasks.apply(settle(wf_task(7, "x", wf="wfl_00000000000000000000000002")))  # type: ignore[arg-type]
        notices_before = [(n.kind, n.object_id) for n in await sqlite.workflows.notices(100)]
    finally:
        await sqlite.stop()
    export = tmp_path / "export.jsonl"
    counts = export_sqlite(db, export)
    text = export.read_text()
    assert SECRET not in text
    end = json.loads(text.splitlines()[-1])
    assert WF in end["callbackSecretsLeftOut"]
    assert (counts["workflows"], counts["task_edges"], counts["task_deps"]) == (2, 2, 1)
    await import_postgres(pg_url, export)
    pg = PostgresStore(pg_url)
    await pg.start()
    try:
        moved = await pg.workflows.get_workflow(WF)
        assert moved is not None and moved.callback_secret is None and moved.max_parallel == 2
        assert moved.open_tasks == 2
        assert [(e.parent_ref, e.outcome) for e in await pg.workflows.edges_into(join.id, None, 10)] == [
            ("a", "met"),
            ("b", "pending"),
        ]
        counts_join = (await pg.workflows.dep_counts([join.id]))[join.id]
        assert (counts_join.parents, counts_join.met, counts_join.lost) == (2, 1, 0)
        assert [(n.kind, n.object_id) for n in await pg.workflows.notices(100)] == notices_before
        page = await pg.tasks.list_tasks(TaskQuery(workflow_id=WF))
        assert [t.id for t in page.items] == [tid(1), tid(2), tid(3)]
        # it goes on: b's settle on PostgreSQL releases the join, with a notice numbered after the imported ones
        before = max(n.seq for n in await pg.workflows.notices(100))
        stored_b = await pg.tasks.get_task(b.id)
        await pg.tasks.apply(settle(stored_b))  # type: ignore[arg-type]
        assert (await pg.workflows.dep_counts([join.id]))[join.id].ready
        last = (await pg.workflows.notices(100))[-1]
        assert (last.kind, last.object_id) == ("task", join.id) and last.seq > before
    finally:
        await pg.stop()
