"""The rows of the node registry's snapshot, as both stores write them (store/nodes.py, postgres/nodes.py).

A node's row has two writers of different things: every instance flushes the heartbeat facts of its own copy
(heartbeats reach any instance), and a drain or undrain, on whichever instance answered the route, sets the drain
flag. So the flag and its revision are columns that only ``SQL_SET_DRAINING`` changes, in one statement that
computes the new revision in the database; the flush writes the document and the heartbeat's time only when its
heartbeat is at least as new as the stored one, and never the flag (docs/INVARIANTS.md, Rows with several writers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from scheduler_gateway.actors.ports import NodeRecord
from scheduler_gateway.daemon.store.common import decode_or_raise, decode_rows, doc_decoder, encode

_decode_node = doc_decoder(NodeRecord)

#: Migration 18 (PostgreSQL: its migration 12, PG_NODE_DRAIN_MIGRATION below): a node's drain flag and its
#: revision, and the time of the heartbeat its document describes, as columns.
NODE_DRAIN_MIGRATION: tuple[str, ...] = (
    "ALTER TABLE nodes ADD COLUMN last_heartbeat_at REAL",
    "ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN drain_revision INTEGER NOT NULL DEFAULT 0",
    # docs are JSON text stored as BLOB: cast for json_extract
    "UPDATE nodes SET last_heartbeat_at = json_extract(CAST(doc AS TEXT), '$.last_heartbeat_at'),"
    " draining = coalesce(json_extract(CAST(doc AS TEXT), '$.draining'), 0)",
)
#: the newest heartbeat wins; a record without one never replaces a heartbeat (the drain columns are left alone)
SQL_PUT_NODE = (
    "INSERT INTO nodes (id, doc, last_heartbeat_at) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE"
    " SET doc = excluded.doc, last_heartbeat_at = excluded.last_heartbeat_at"
    " WHERE coalesce(excluded.last_heartbeat_at, -1) >= coalesce(nodes.last_heartbeat_at, -1)"
)
SQL_SET_DRAINING = (
    "UPDATE nodes SET draining = ?, drain_revision = drain_revision + 1 WHERE id = ? RETURNING doc, draining,"
    " drain_revision"
)
SQL_LIST_NODES = "SELECT id, doc, draining, drain_revision FROM nodes ORDER BY id"


def node_row(node: NodeRecord) -> tuple[str, bytes, float | None]:
    """``SQL_PUT_NODE``'s values: the document without the drain flag (its columns are the truth)."""
    doc = msgspec.structs.replace(node, draining=False, drain_revision=0)
    return node.id, encode(doc), node.last_heartbeat_at


def with_drain(node: NodeRecord, draining: Any, drain_revision: Any) -> NodeRecord:
    return msgspec.structs.replace(node, draining=bool(draining), drain_revision=int(drain_revision))


def stored_nodes(rows: Iterable[Any]) -> list[NodeRecord]:
    """``SQL_LIST_NODES``'s rows as records with their drain columns (a row that does not decode is skipped)."""
    rows = list(rows)
    drains = {str(r[0]): (r[2], r[3]) for r in rows}
    return [with_drain(n, *drains[n.id]) for n in decode_rows(_decode_node, rows, "node")]


#: Migration 12, as the SQLite store's 18 (NODE_DRAIN_MIGRATION above): the drain flag, its revision and
#: the heartbeat's time as columns
PG_NODE_DRAIN_MIGRATION: tuple[str, ...] = (
    "ALTER TABLE nodes ADD COLUMN last_heartbeat_at double precision",
    "ALTER TABLE nodes ADD COLUMN draining boolean NOT NULL DEFAULT false",
    "ALTER TABLE nodes ADD COLUMN drain_revision bigint NOT NULL DEFAULT 0",
    "UPDATE nodes SET last_heartbeat_at = (convert_from(doc, 'UTF8')::jsonb ->> 'last_heartbeat_at')::double precision,"
    " draining = coalesce((convert_from(doc, 'UTF8')::jsonb ->> 'draining')::boolean, false)",
)


def decode_node(doc: Any, node_id: str) -> NodeRecord:
    return decode_or_raise(_decode_node, doc, "node", node_id)
