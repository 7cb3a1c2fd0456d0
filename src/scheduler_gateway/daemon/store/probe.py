"""What ``gatewayd check`` asks a store without starting it: does it answer, take a write (rolled back), and
which schema version does it hold. Nothing is migrated or created here; ``gatewayd run`` does that.

Every answer is a line fit for printing: the URL redacted, a driver's error reduced to its type and SQLSTATE
or its first line (libpq's messages name the host and the user, never the password; the caller scrubs
known secrets as well).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import psycopg

from scheduler_gateway.daemon.config.store_url import StoreLocation
from scheduler_gateway.daemon.store.migrations import MIGRATIONS
from scheduler_gateway.daemon.store.postgres.migrations import SCHEMA_VERSION as PG_SCHEMA_VERSION

PROBE_TIMEOUT_S = 2


@dataclass(frozen=True, slots=True)
class StoreProbe:
    ok: bool
    detail: str


def known_version(kind: str) -> int:
    return PG_SCHEMA_VERSION if kind == "postgresql" else len(MIGRATIONS)


def describe_version(found: int, known: int) -> tuple[bool, str]:
    """(ok, words) for a schema version found against the one this gatewayd knows."""
    if found == 0:
        return True, f"no schema yet (gatewayd run creates version {known})"
    if found > known:
        return False, (
            f"schema version {found} is newer than this gatewayd knows ({known}); run the gatewayd version that"
            ' wrote it, or restore a dump taken before the upgrade (docs/OPERATIONS.md, "A damaged store file")'
        )
    if found < known:
        return True, f"schema version {found} (gatewayd run migrates it to {known})"
    return True, f"schema version {found}"


def sqlite_schema_version(path_uri: str) -> int:
    """The version recorded in an existing SQLite file (0: none), read only."""
    conn = sqlite3.connect(path_uri, uri=True, timeout=PROBE_TIMEOUT_S, isolation_level=None)
    try:
        row = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
        if row is None:
            return 0
        found = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
        return int(found[0]) if found is not None else 0
    finally:
        conn.close()


def probe_postgres(location: StoreLocation) -> StoreProbe:
    """Connect, read the schema version, write in a transaction rolled back, close."""
    where = f"postgresql {location.redacted}"
    try:
        with psycopg.connect(location.url, connect_timeout=PROBE_TIMEOUT_S, autocommit=True) as conn:
            server = conn.info.server_version
            row = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
            found = 0
            if row is not None and row[0]:
                got = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
                found = int(got[0]) if got is not None else 0
            with conn.transaction(force_rollback=True):
                conn.execute("CREATE TEMPORARY TABLE gw_check_probe (x integer)")
                conn.execute("INSERT INTO gw_check_probe VALUES (1)")
            instances = _live_instances(conn) if found >= 2 else ""
    except psycopg.Error as exc:
        return StoreProbe(False, f"{where}: {_pg_reason(exc)}")
    ok, version = describe_version(found, PG_SCHEMA_VERSION)
    major, minor = divmod(server, 10000)
    return StoreProbe(ok, f"{where} (server {major}.{minor}) answers and is writable, {version}{instances}")


#: an instance counts as live while its row was refreshed this recently (it refreshes every 2 s)
INSTANCE_ALIVE_S = 10.0


def _live_instances(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    """``; live instances: a (leader, term 3), b`` from ``gateway_instances`` and ``duty_leases`` (empty: none)."""
    now = "extract(epoch from clock_timestamp())"
    rows = conn.execute(
        f"SELECT id FROM gateway_instances WHERE last_seen_at > {now} - %s ORDER BY id", (INSTANCE_ALIVE_S,)
    ).fetchall()
    lead = conn.execute(f"SELECT holder, term FROM duty_leases WHERE duty = 'leader' AND expires_at > {now}").fetchone()
    if not rows:
        return "; no live instance"
    names = [f"{r[0]} (leader, term {lead[1]})" if lead is not None and lead[0] == r[0] else str(r[0]) for r in rows]
    return "; live instances: " + ", ".join(names)


def _pg_reason(exc: psycopg.Error) -> str:
    state = getattr(exc, "sqlstate", None)
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    name = type(exc).__name__
    return f"{name} {state}: {first}" if state else f"{name}: {first}" if first else name
