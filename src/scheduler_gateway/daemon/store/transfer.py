"""``gatewayd export --to FILE`` and ``gatewayd import --from FILE``: move a deployment from SQLite to PostgreSQL.

The two stores keep the same tables (``store/migrations.py``, ``store/postgres/migrations.py``): msgspec JSON
documents beside the columns the queries read. Export reads every row of every table the gateway owns from
the SQLite file (read-only, in one read transaction: one consistent snapshot) and writes JSON lines:

- a header ``{"format", "schemaVersion", "exportedAt", "sequences"}`` (``sequences``: the highest ``seq``
  SQLite ever handed out for the audit, the outbox, the rates' starts and the artifacts, so the PostgreSQL
  sequences never reuse one);
- one ``{"table", "row"}`` line per row, a row being its stored columns; a byte column is
  ``{"$bytes": text}`` (the document's bytes as UTF-8, byte-exact) or ``{"$base64": ...}`` when not UTF-8;
- a last ``{"end": true, "counts": {...}, "callbackSecretsLeftOut": [task ids]}`` line: a truncated file is
  refused on import. No callback secret is exported (``transfer_secrets.py``): the end line names the tasks
  whose secret was left out, and import warns about them.

Import checks the whole file first, then writes every row into the configured PostgreSQL store in ONE
transaction (all or nothing), refuses a store that holds any row already, fills the PostgreSQL-only task
columns (lease expiry, attempt deadline, finish) from each task's document as the store's own writes do, and
advances the sequences past the imported numbers. Stop gatewayd first (docs/OPERATIONS.md).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from scheduler_gateway.actors.model.records import TERMINAL_STATES, Task
from scheduler_gateway.daemon.config import ConfigError, load_config
from scheduler_gateway.daemon.store.change_rows import running_deadlines
from scheduler_gateway.daemon.store.common import decode_or_raise, doc_decoder
from scheduler_gateway.daemon.store.migrations import MIGRATIONS
from scheduler_gateway.daemon.store.postgres.db import Conn, PgDb, without_idle_bound
from scheduler_gateway.daemon.store.transfer_secrets import LEFT_OUT_KEY, left_out_warning, without_secrets
from scheduler_gateway.process_lock import store_lock
from scheduler_gateway.wire.errors import Fault, GatewayError

FORMAT = "scheduler-gateway-export/1"

#: The tables moved, in the order they are written, each with the order its rows are read in.
TABLES: tuple[tuple[str, str], ...] = (
    ("tasks", "id"),
    ("task_history", "task_id, revision"),
    ("audit", "seq"),
    ("idempotency", "owner, key"),
    ("dead_letters", "dead_letter_id"),
    ("callback_deliveries", "id"),
    ("callback_dead_letters", "id"),
    ("principals", "token_hash"),
    ("nodes", "id"),
    ("threads", "id"),
    ("scheduled_tasks", "id"),
    ("scheduled_runs", "id"),
    ("outbox", "seq"),
    # flow control: each kind's settings (a paused kind stays paused, its limits hold) and the starts its rates
    # count (a rate's window goes on across the move)
    ("kinds", "kind"),
    ("task_starts", "seq"),
    # the artifact index and each task's usage (the bytes stay in NATS, which is not moved)
    ("artifacts", "seq"),
    ("artifact_usage", "task_id"),
    # the newest create of each unique key whose task was purged (a later create's window still reaches it)
    ("unique_marks", "owner, kind, unique_key"),
    # workflows (CONTRACT 2.12): each workflow's row (no callback secret: transfer_secrets.py), its edges with
    # their outcomes, its tasks' dependency counters and the releaser's notices not yet handled
    ("workflows", "id"),
    ("task_edges", "parent_id, child_id"),
    ("task_deps", "task_id"),
    ("workflow_notices", "seq"),
)
#: The SQLite tables not moved: what the PostgreSQL store derives from the rows above as they are written
#: (task_labels, task_minutes: its triggers; SQLite's own task_counts and task_created_off), the token
#: revocation log (a revoked token's row is gone already; the log only tells running instances' caches, and
#: none runs), the liveness probe's row and the schema's version. A test holds every table to one of the lists.
NOT_MOVED: frozenset[str] = frozenset(
    {"task_labels", "task_minutes", "task_counts", "task_created_off", "token_revocations", "health", "schema_version"}
)
_TABLE_NAMES = frozenset(t for t, _ in TABLES)
_SEQUENCED = ("audit", "outbox", "task_starts", "artifacts", "workflow_notices")
_BATCH = 1000
_decode_task = doc_decoder(Task)


class TransferError(Fault):
    """The export or import was refused or failed; the message is fit for printing (no contents, no secrets)."""


def _encode_value(value: Any) -> Any:
    if isinstance(value, bytes | memoryview):
        raw = bytes(value)
        try:
            return {"$bytes": raw.decode("utf-8")}
        except UnicodeDecodeError:
            return {"$base64": base64.b64encode(raw).decode("ascii")}
    return value


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "$bytes" in value:
            return str(value["$bytes"]).encode("utf-8")
        if "$base64" in value:
            return base64.b64decode(str(value["$base64"]))
        raise TransferError("a row holds a value that is neither a column value nor encoded bytes")
    return value


# ---------------------------------------------------------------- export


def export_sqlite(db_path: Path, target: Path) -> dict[str, int]:
    """Write the store at ``db_path`` to ``target`` (replaced atomically); the number of rows per table."""
    if not db_path.is_file():
        raise TransferError(f"{db_path} does not exist: nothing to export")
    holder = store_lock(db_path).holder()
    if holder is not None:
        # what it commits after the snapshot would not be in the file, and it would go on without the rows
        raise TransferError(f"the gatewayd with pid {holder} runs on {db_path}: stop it first, then export")
    if target.is_dir():
        raise TransferError(f"{target} is a directory; name the export file")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(db_path.absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None, timeout=10)
    try:
        conn.execute("BEGIN")  # one read transaction: every table as of one commit
        version = _scalar(conn, "SELECT coalesce(max(version), 0) FROM schema_version")
        if version != len(MIGRATIONS):
            raise TransferError(
                f"the store has schema version {version}, this gatewayd writes {len(MIGRATIONS)}:"
                " start this gatewayd on it once (it migrates), stop it, then export"
            )
        sequences = {name: int(seq) for name, seq in conn.execute("SELECT name, seq FROM sqlite_sequence")}
        header = {
            "format": FORMAT,
            "schemaVersion": version,
            "exportedAt": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "sequences": {t: sequences.get(t, 0) for t in _SEQUENCED},
        }
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # payloads, token hashes: 0600 (no secret)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            counts = _write_rows(conn, out, header)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except sqlite3.Error as exc:
        raise TransferError(f"reading the store failed ({getattr(exc, 'sqlite_errorname', None) or exc})") from exc
    except OSError as exc:
        raise TransferError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        conn.close()
        tmp.unlink(missing_ok=True)
    return counts


def _write_rows(conn: sqlite3.Connection, out: IO[str], header: dict[str, Any]) -> dict[str, int]:
    out.write(json.dumps(header) + "\n")
    counts: dict[str, int] = {}
    left_out: set[str] = set()  # tasks whose callback secret was left out (store/transfer_secrets.py)
    for table, order in TABLES:
        # table_info leaves out generated columns (a store has none since migration 16)
        columns = [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]
        n = 0
        cur = conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}")
        for values in cur:
            try:
                row = without_secrets(table, dict(zip(columns, values, strict=True)), left_out)
            except ValueError as exc:
                raise TransferError(str(exc)) from None
            line = {"table": table, "row": {c: _encode_value(v) for c, v in row.items()}}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            n += 1
        counts[table] = n
    out.write(json.dumps({"end": True, "counts": counts, LEFT_OUT_KEY: sorted(left_out)}) + "\n")
    return counts


def _scalar(conn: sqlite3.Connection, sql: str) -> int:
    try:
        row = conn.execute(sql).fetchone()
    except sqlite3.OperationalError:
        return 0
    return int(row[0]) if row is not None else 0


# ---------------------------------------------------------------- import


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, start=1):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                raise TransferError(f"{path}: line {n} is not JSON") from None
            if not isinstance(obj, dict):
                raise TransferError(f"{path}: line {n} is not an object")
            yield obj


def check_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The header and the row counts of an export file, after checking it is whole and of this format."""
    if not path.is_file():
        raise TransferError(f"{path} does not exist")
    lines = _lines(path)
    header = next(lines, None)
    if header is None or header.get("format") != FORMAT:
        raise TransferError(f"{path} is not a gatewayd export (expected format {FORMAT!r})")
    if header.get("schemaVersion") != len(MIGRATIONS):
        raise TransferError(
            f"{path} has schema version {header.get('schemaVersion')}, this gatewayd reads {len(MIGRATIONS)}:"
            " export with the same gatewayd version you import with"
        )
    counts: dict[str, int] = {}
    end: dict[str, Any] | None = None
    for obj in lines:
        if end is not None:
            raise TransferError(f"{path} has lines after its end line")
        if obj.get("end") is True:
            end = obj
            continue
        table = obj.get("table")
        if table not in _TABLE_NAMES or not isinstance(obj.get("row"), dict):
            raise TransferError(f"{path} holds a line that is not a row of a known table")
        counts[str(table)] = counts.get(str(table), 0) + 1
    if end is None:
        raise TransferError(f"{path} has no end line: the export is truncated")
    if {t: n for t, n in end.get("counts", {}).items() if n} != counts:
        raise TransferError(f"{path}: the rows do not match the counts of its end line")
    header = {**header, LEFT_OUT_KEY: [str(i) for i in end.get(LEFT_OUT_KEY, [])]}
    return header, counts


def _task_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The PostgreSQL-only task columns, from the document, as the store's own writes fill them."""
    task = decode_or_raise(_decode_task, row["doc"], "task", str(row["id"]))
    lease, deadline = running_deadlines(task)
    finished = task.finished_at if task.state in TERMINAL_STATES else None
    return {**row, "lease_expires_at": lease, "deadline_at": deadline, "finished_at": finished}


async def _pg_columns(conn: Conn) -> dict[str, dict[str, str]]:
    cur = await conn.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = ANY(%s)",
        (list(_TABLE_NAMES),),
    )
    columns: dict[str, dict[str, str]] = {}
    for table, column, data_type in await cur.fetchall():
        columns.setdefault(str(table), {})[str(column)] = str(data_type)
    return columns


async def _refuse_non_empty(conn: Conn) -> None:
    holding = []
    for table, _ in TABLES:
        cur = await conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})")
        row = await cur.fetchone()
        if row is not None and row[0]:
            holding.append(table)
    if holding:
        raise TransferError(
            "the target store is not empty (rows in: " + ", ".join(holding) + "); import only into a new database"
        )


async def _insert(conn: Conn, table: str, types: dict[str, str], rows: list[dict[str, Any]]) -> None:
    if table == "tasks":
        rows = [_task_columns(r) for r in rows]
    names = list(rows[0])
    unknown = [c for c in names if c not in types]
    if unknown:
        raise TransferError(f"the target's table {table} has no column {', '.join(unknown)}")
    values = [tuple(bool(r[c]) if types[c] == "boolean" and r[c] is not None else r[c] for c in names) for r in rows]
    sql = f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
    async with conn.cursor() as cur:
        await cur.executemany(sql, values)


async def import_postgres(url: str, path: Path) -> dict[str, int]:
    """Write the export at ``path`` into the (empty) PostgreSQL store at ``url`` in one transaction."""
    header, counts = check_file(path)
    db = PgDb(url, max_size=1)
    await db.start()  # migrates a new database to the current schema
    try:
        async with db.transaction() as conn:
            await without_idle_bound(conn)  # one transaction for the whole file, idle while each batch is read
            await _refuse_non_empty(conn)
            types = await _pg_columns(conn)
            table: str | None = None
            batch: list[dict[str, Any]] = []
            lines = _lines(path)
            next(lines)  # the header, checked
            for obj in lines:
                if obj.get("end") is True:
                    break
                if batch and (obj["table"] != table or len(batch) >= _BATCH):
                    await _insert(conn, str(table), types[str(table)], batch)
                    batch = []
                table = str(obj["table"])
                batch.append({str(c): _decode_value(v) for c, v in obj["row"].items()})
            if batch:
                await _insert(conn, str(table), types[str(table)], batch)
            sequences = header.get("sequences") or {}
            for name in _SEQUENCED:
                await conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{name}', 'seq'), m, true)"
                    f" FROM (SELECT greatest(coalesce(max(seq), 0), %s) AS m FROM {name}) s WHERE m > 0",
                    (int(sequences.get(name, 0)),),
                )
    finally:
        await db.stop()
    return counts


# ---------------------------------------------------------------- commands


def _summary(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts.get(t, 0)} {t}" for t, _ in TABLES)


def export_main(config_path: Path | None, target: Path) -> int:
    """``gatewayd export``: one line on stdout, or the reason on stderr and exit 1."""
    try:
        config = load_config(config_path, os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config: {problem}", file=sys.stderr)
        return 2
    location = config.store_location
    if location.kind != "sqlite" or location.path is None:
        print(
            f"gatewayd export: reads a SQLite store; the configured store is {location.redacted}",
            file=sys.stderr,
        )
        return 1
    try:
        counts = export_sqlite(location.path, target)
    except TransferError as exc:
        print(f"gatewayd export: {exc}", file=sys.stderr)
        return 1
    print(f"gatewayd export: {location.path} -> {target}: {_summary(counts)}")
    return 0


def import_main(config_path: Path | None, source: Path) -> int:
    """``gatewayd import``: one line on stdout, or the reason on stderr and exit 1 (nothing written)."""
    try:
        config = load_config(config_path, os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config: {problem}", file=sys.stderr)
        return 2
    location = config.store_location
    shown = location.redacted
    if location.kind != "postgresql":
        print(
            f"gatewayd import: writes into a PostgreSQL store; the configured store is {shown}"
            " (set [store] url / GW_STORE_URL to postgresql://...)",
            file=sys.stderr,
        )
        return 1
    try:
        left_out = check_file(source)[0][LEFT_OUT_KEY]
        counts = asyncio.run(import_postgres(location.url, source))
    except (TransferError, GatewayError) as exc:
        print(f"gatewayd import: {exc} (nothing was imported)", file=sys.stderr)
        return 1
    print(f"gatewayd import: {source} -> {shown}: {_summary(counts)}")
    warning = left_out_warning(left_out, bool(config.callbacks.secret))
    if warning:
        print(f"gatewayd import: warning: {warning}", file=sys.stderr)
    return 0
