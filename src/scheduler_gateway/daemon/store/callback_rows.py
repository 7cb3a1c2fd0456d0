"""The statements of callback deliveries and callback dead letters, written once for both stores with SQLite's ``?``
placeholders; the PostgreSQL store runs ``common.pg_sql`` of each, made at import. A redelivery's conditional
insert stays each store's own (SQLite: one ``INSERT ... SELECT ... WHERE EXISTS``; PostgreSQL: the delete's
row count decides)."""

SQL_INSERT_CALLBACK_LETTER = "INSERT INTO callback_dead_letters (id, task_id, owner, doc) VALUES (?, ?, ?, ?)"
SQL_BACKLOG_OF_OWNER = "SELECT count(*) FROM callback_deliveries d JOIN tasks t ON t.id = d.task_id WHERE t.owner = ?"
SQL_PENDING_FIRST = "SELECT id, doc FROM callback_deliveries ORDER BY due_at, id LIMIT ?"
#: a row-value comparison: an index seek on (due_at, id)
SQL_PENDING_AFTER = "SELECT id, doc FROM callback_deliveries WHERE (due_at, id) > (?, ?) ORDER BY due_at, id LIMIT ?"
SQL_BACKLOG = "SELECT count(*) FROM callback_deliveries"
SQL_RESCHEDULE_CALLBACK = "UPDATE callback_deliveries SET due_at = ?, doc = ? WHERE id = ?"
SQL_DELETE_DELIVERY = "DELETE FROM callback_deliveries WHERE id = ?"
SQL_GET_CALLBACK_LETTER = "SELECT doc FROM callback_dead_letters WHERE id = ?"
SQL_DELETE_CALLBACK_LETTER = "DELETE FROM callback_dead_letters WHERE id = ?"
