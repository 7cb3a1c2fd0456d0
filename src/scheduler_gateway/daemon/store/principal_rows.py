"""The statements of API tokens (``principals``), their revocation log and the health row, written once for both
stores with SQLite's ``?`` placeholders; the PostgreSQL store runs ``common.pg_sql`` of each, made at import. The
PostgreSQL store's own: the lock that orders revocations (``postgres/nodes.py``)."""

SQL_PUT_PRINCIPAL = (
    "INSERT INTO principals (token_hash, doc) VALUES (?, ?) ON CONFLICT (token_hash) DO UPDATE SET doc = excluded.doc"
)
SQL_LIST_PRINCIPALS = "SELECT doc, last_used_at FROM principals ORDER BY token_hash"
SQL_GET_PRINCIPAL = "SELECT doc, last_used_at FROM principals WHERE token_hash = ?"
SQL_DELETE_PRINCIPAL = "DELETE FROM principals WHERE token_hash = ?"
SQL_LOG_REVOCATION = "INSERT INTO token_revocations (token_hash, revoked_at) VALUES (?, ?)"
SQL_NEWEST_REVOCATION = "SELECT coalesce(max(seq), 0) FROM token_revocations"
SQL_REVOCATIONS_AFTER = "SELECT seq, token_hash FROM token_revocations WHERE seq > ? ORDER BY seq"
#: a last use never moves back (several instances flush their own)
SQL_TOUCH_PRINCIPAL = (
    "UPDATE principals SET last_used_at = ? WHERE token_hash = ? AND (last_used_at IS NULL OR last_used_at < ?)"
)
SQL_PING = "INSERT INTO health (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at"
