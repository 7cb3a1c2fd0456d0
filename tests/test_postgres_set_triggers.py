"""The tasks table's derived rows on PostgreSQL written once per statement (migration 18, postgres/set_triggers.py):
the console's columns, the labels, the count moves and the per-minute figures are what each task says, whichever
path wrote it (a batch's set statement, the change-by-change path, raw SQL, a heartbeat's lease update), and no
trigger on tasks runs a statement per inserted or updated row any more (an update runs no row trigger at all)."""

from __future__ import annotations

import psycopg

from scheduler_gateway.actors.model.records import TaskError
from scheduler_gateway.daemon.store.postgres import PostgresStore

from .test_store_contract import T0, bump, create, leaving, make_task, update

_PAYLOAD = {"labels": {"x": "y"}, "node_id": "not-a-node", "text": "a\u0000b"}


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]  # type: ignore[arg-type]


async def test_no_trigger_on_tasks_writes_a_row_per_inserted_or_updated_task(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    await store.stop()
    # tgtype: bit 0 row-level, bit 2 INSERT, bit 4 UPDATE (pg_trigger.h)
    found = _rows(
        pg_url,
        "SELECT tgname, tgtype & 1 = 1, p.proname, coalesce(p.proconfig, '{}') FROM pg_trigger t"
        " JOIN pg_proc p ON p.oid = t.tgfoid WHERE tgrelid = 'tasks'::regclass AND NOT tgisinternal"
        " AND tgtype & (4 | 16) <> 0 ORDER BY tgname",
    )
    per_row = {name: fn for name, row, fn, _ in found if row}
    # a row trigger only sets the row's own columns (node_id, error_code); every other row is written per statement
    assert set(per_row.values()) == {"gw_task_columns"}, found
    # and only on insert: an update's writer sets node_id and error_code itself (ChangeRows.search)
    assert [name for name, row, _, _ in found if row] == ["tasks_columns_insert"], found
    config = {fn: conf for _, _, fn, conf in found}
    assert "enable_nestloop=off" in config["gw_tasks_updated"], config  # its join is planned once per session


async def test_derived_rows_follow_every_write_path(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    try:
        plain = [make_task(i, payload=_PAYLOAD) for i in range(1, 21)]
        labelled = [make_task(i, labels={"team": f"t{i % 2}", "env": "prod"}) for i in range(21, 31)]
        assert await store.tasks.apply_many([create(t) for t in plain + labelled]) == [None] * 30
        # a payload holding "node_id" and "labels" keys sets neither
        assert _rows(pg_url, "SELECT count(*) FROM tasks WHERE node_id IS NOT NULL OR error_code IS NOT NULL") == [(0,)]
        # claims in one batch: their node, their minute and queue latency (claimed T0 + 100, not_before T0)
        claimed = [bump(t, state="running", node_id=f"node-{t.id[-1]}", started_at=T0 + 100) for t in plain]
        claims = [leaving(update(a, b, "claim"), "queued") for a, b in zip(plain, claimed, strict=True)]
        got = await store.tasks.apply_many(claims)
        assert got == [None] * 20
        # a heartbeat's lease update (no state change): no move, no minute
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE tasks SET lease_expires_at = 1 WHERE id = %s", (claimed[0].id,))
        # settles: 5 failed with a code, 5 succeeded in one batch; one more failed alone (change by change)
        failed = [
            bump(t, state="failed", error=TaskError(code="E_BAD"), finished_at=T0 + 200, updated_at=T0 + 200)
            for t in claimed[:5]
        ]
        done = [bump(t, state="succeeded", finished_at=T0 + 260, updated_at=T0 + 260) for t in claimed[5:10]]
        settles = [leaving(update(a, b, "fail"), "running") for a, b in zip(claimed[:5], failed, strict=True)]
        settles += [leaving(update(a, b, "succeed"), "running") for a, b in zip(claimed[5:10], done, strict=True)]
        assert await store.tasks.apply_many(settles) == [None] * 10
        alone = bump(claimed[10], state="failed", error=TaskError(code="E_ALONE"), finished_at=T0 + 200)
        again = bump(alone, state="failed")  # the same task twice in a batch: both go change by change
        assert await store.tasks.apply_many(
            [leaving(update(claimed[10], alone, "fail"), "running"), leaving(update(alone, again, "fail"), "failed")]
        ) == [None, None]

        columns = dict(
            ((i, (n, e)) for i, n, e in _rows(pg_url, "SELECT id, node_id, error_code FROM tasks"))  # type: ignore[misc]
        )
        for t in failed:
            assert columns[t.id] == (t.node_id, "E_BAD")
        for t in done + claimed[11:]:
            assert columns[t.id] == (t.node_id, None)
        assert columns[alone.id] == (alone.node_id, "E_ALONE")
        for t in labelled:
            assert columns[t.id] == (None, None)
        assert columns[claimed[15].id] == ("node-6", None)
        labels = _rows(pg_url, "SELECT task_id, key, value FROM task_labels ORDER BY 1, 2")
        assert labels == sorted((t.id, k, v) for t in labelled for k, v in t.labels.items())

        want = {("failed", "echo"): 6, ("succeeded", "echo"): 5, ("running", "echo"): 9, ("queued", "echo"): 10}
        assert {(s, k): n for s, k, n in await store.tasks.task_counts(None)} == want
        minutes = {
            m.minute: (m.finished, m.failed, m.claimed, m.latency_sum_s)
            for m in await store.search.task_minutes(int(T0 // 60) - 1)
        }
        claim_minute, fail_minute, done_minute = int((T0 + 100) // 60), int((T0 + 200) // 60), int((T0 + 260) // 60)
        assert minutes == {claim_minute: (0, 0, 20, 2000.0), fail_minute: (6, 6, 0, 0.0), done_minute: (5, 0, 0, 0.0)}
    finally:
        await store.stop()


async def test_the_parent_and_request_indexes_hold_only_rows_with_one_and_serve_their_reads(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    try:
        parent = make_task(1)
        child = make_task(2, parent_id=parent.id)
        assert await store.tasks.apply_many([create(parent), create(child)]) == [None, None]
    finally:
        await store.stop()
    defs = dict(
        _rows(pg_url, "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN ('tasks_parent', 'audit_request')")
    )
    assert str(defs["tasks_parent"]).endswith("WHERE (parent_id IS NOT NULL)"), defs
    assert str(defs["audit_request"]).endswith("WHERE (request_id IS NOT NULL)"), defs
    assert _rows(pg_url, "SELECT count(*) FROM tasks WHERE parent_id IS NOT NULL") == [(1,)]
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET enable_seqscan = off")
        for sql, index in (
            (
                "SELECT id FROM tasks t WHERE t.parent_id >= %s AND t.parent_id <= %s"
                " ORDER BY t.parent_id, t.id LIMIT 5",
                "tasks_parent",
            ),
            ("SELECT id FROM tasks WHERE parent_id = %s", "tasks_parent"),  # the subtree guard, retention
            ("SELECT seq FROM audit WHERE request_id = %s ORDER BY seq DESC LIMIT 5", "audit_request"),
        ):
            n = sql.count("%s")
            plan = " ".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql, [parent.id] * n))  # type: ignore[arg-type]
            assert index in plan, (sql, plan)
