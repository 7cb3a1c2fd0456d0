"""The statements of the ``kinds`` table (a kind's settings document), written once for both stores with SQLite's
``?`` placeholders; the PostgreSQL store runs ``common.pg_sql`` of each, made at import. A document is read by
``kind_docs.read_kind_doc``."""

#: a change's write (``swap_kind``): only over the document it was decided on, or only where no row is; on
#: PostgreSQL the row lock the UPDATE takes orders two instances' writes of one kind, and the loser matches no row
SQL_SWAP_KIND = "UPDATE kinds SET doc = ? WHERE kind = ? AND doc = ?"
SQL_INSERT_KIND_IF_NONE = "INSERT INTO kinds (kind, doc) VALUES (?, ?) ON CONFLICT (kind) DO NOTHING"
#: an unconditional write (``put_kind``: a sole writer, a restore)
SQL_PUT_KIND = "INSERT INTO kinds (kind, doc) VALUES (?, ?) ON CONFLICT (kind) DO UPDATE SET doc = excluded.doc"
SQL_GET_KIND = "SELECT doc FROM kinds WHERE kind = ?"
SQL_LIST_KINDS = "SELECT kind, doc FROM kinds ORDER BY kind"
