"""The SQLite store: one connection and its writer, migrations, tasks, schedules, callbacks, backup."""
