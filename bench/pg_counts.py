"""Per-task counts of the production shape's run: what load does not change, beside the CPU it does.

This module owns one measurement: counters sampled at the start and the end of the measured window of
``--store postgres`` runs (bench/pg_shape.py), their difference divided by the run's tasks.

- nats-server (its monitoring port, ``/subsz?subs=1``): the messages delivered to each subscription, summed by
  subject with the node id and inbox tokens folded (``gw.claim.*``, ``_INBOX.*``): claims, heartbeats, settles,
  offers pulled, JetStream API calls and acks per task; and ``/varz`` ``in_msgs`` / ``out_msgs``;
- each gatewayd (``/metrics``): offers published, refusals by operation and code, transitions by action;
- PostgreSQL (``pg_stat_statements``, preloaded by ``PgGateways``; ``pg_stat_database``): transactions committed
  and rolled back per task, and per statement its calls and execution time per task, the costliest first; per
  PL/pgSQL function (the triggers; ``pg_stat_user_functions``) its calls and own time per task.

A count that doubles with a second instance while the tasks stay the same names the work that instance added.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import psycopg

#: a subscription's subject, its per-node or per-request tokens folded so that counts sum by purpose
_FOLDS = [
    (re.compile(r"\A_INBOX\..*\Z"), "_INBOX.*"),
    (re.compile(r"\A_GW_INBOX\..*\Z"), "_GW_INBOX.*"),
    (re.compile(r"\A(gw\.(?:claim|heartbeat|settle|cancel|artifact))\.[^.]+\Z"), r"\1.*"),
    (re.compile(r"\A\$JS\.ACK\..*\Z"), "$JS.ACK.*"),
]
#: statements listed per run (the costliest by execution time)
TOP_STATEMENTS = 25


def fold(subject: str) -> str:
    for pattern, repl in _FOLDS:
        if pattern.fullmatch(subject):
            return pattern.sub(repl, subject)
    return subject


def _get(url: str, token: str | None = None) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as resp:  # loopback URLs of our own processes
        return resp.read().decode()


def nats_counts(monitor: str) -> dict[str, float]:
    """``nats.<subject>``: messages delivered to the subscriptions of each folded subject; ``nats.in`` / ``.out``."""
    out: dict[str, float] = {}
    subsz = json.loads(_get(f"{monitor}/subsz?subs=1&limit=100000"))
    for sub in subsz.get("subscriptions_list") or []:
        key = "nats." + fold(sub["subject"]) + (f" [{sub['qgroup']}]" if sub.get("qgroup") else "")
        out[key] = out.get(key, 0.0) + float(sub.get("msgs", 0))
    varz = json.loads(_get(f"{monitor}/varz"))
    out["nats.in_msgs"] = float(varz["in_msgs"])
    out["nats.out_msgs"] = float(varz["out_msgs"])
    return out


_SAMPLE = re.compile(r"\A(gw_[a-z_]+?)(?:_total)?(\{[^}]*\})? ([0-9.e+-]+)\Z")
_COUNTED = ("gw_offers_published", "gw_refused", "gw_transitions", "gw_lease_expiries", "gw_settles_found_waiting")


def gateway_counts(bases: list[tuple[str, str]]) -> dict[str, float]:
    """``gw.<counter>{labels}`` summed over the instances, for the counters that say how much work a task made."""
    out: dict[str, float] = {}
    for base, token in bases:
        for line in _get(f"{base}/metrics", token).splitlines():
            m = _SAMPLE.fullmatch(line)
            if m is None or not m.group(1).startswith(_COUNTED) or line.startswith("#"):
                continue
            labels = re.sub(r',?(kind|state)="[^"]*"', "", m.group(2) or "").replace("{,", "{")
            key = "gw." + m.group(1) + ("" if labels in ("", "{}") else labels)
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def pg_counts(url: str) -> tuple[dict[str, float], dict[str, tuple[str, float, float, float]]]:
    """(``pg.xact_commit`` / ``pg.xact_rollback`` of the database, statement id -> (text, calls, ms, rows)); a
    PL/pgSQL function's row is keyed ``fn:<schema.name>``, its ms its own time."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        db = {"pg.xact_commit": float(row[0]), "pg.xact_rollback": float(row[1])}
        stmts: dict[str, tuple[str, float, float, float]] = {}
        try:
            # a statement run inside another (a trigger's, ``toplevel`` false) is marked: its time is also its
            # caller's, so only the top-level ones add up to the database's execution time
            for qid, top, query, calls, ms, rows in conn.execute(
                "SELECT queryid::text || toplevel::text, toplevel, query, calls, total_exec_time, rows"
                " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ):
                text = ("" if top else "(nested) ") + " ".join(str(query).split())
                stmts[qid] = (text[:400], float(calls), float(ms), float(rows))
        except psycopg.Error:
            pass  # no pg_stat_statements: the database counts alone
        # the PL/pgSQL functions (the triggers) by their own time, with ``track_functions = pl`` (0 rows without)
        for name, calls, self_ms in conn.execute(
            "SELECT schemaname || '.' || funcname, calls, self_time FROM pg_stat_user_functions"
        ):
            stmts["fn:" + str(name)] = (str(name), float(calls), float(self_ms), 0.0)
    return db, stmts


class CountProbe:
    """The counters above, sampled at ``begin`` and ``end`` of the measured window."""

    def __init__(self, monitor: str, bases: list[tuple[str, str]], pg_url: str) -> None:
        self.monitor = monitor
        self.bases = bases
        self.pg_url = pg_url
        self._start: tuple[dict[str, float], dict[str, tuple[str, float, float, float]]] = ({}, {})

    def _sample(self) -> tuple[dict[str, float], dict[str, tuple[str, float, float, float]]]:
        flat = nats_counts(self.monitor)
        flat.update(gateway_counts(self.bases))
        db, stmts = pg_counts(self.pg_url)
        flat.update(db)
        return flat, stmts

    def begin(self) -> None:
        self._start = self._sample()

    def end(self, n: int) -> dict[str, Any]:
        (flat1, st1), (flat0, st0) = self._sample(), self._start
        per_task = {k: (v - flat0.get(k, 0.0)) / n for k, v in sorted(flat1.items()) if v - flat0.get(k, 0.0) > 0}
        rows: list[tuple[float, float, float, str]] = []
        funcs: list[tuple[float, float, float, str]] = []
        for qid, (text, calls, ms, nrows) in st1.items():
            _, c0, ms0, r0 = st0.get(qid, ("", 0.0, 0.0, 0.0))
            if calls - c0 > 0:
                (funcs if qid.startswith("fn:") else rows).append((ms - ms0, calls - c0, nrows - r0, text))
        rows.sort(reverse=True)
        stmts = [
            {"us_per_task": 1e3 * ms / n, "calls_per_task": calls / n, "rows_per_call": r / calls, "query": text}
            for ms, calls, r, text in rows[:TOP_STATEMENTS]
        ]
        funcs.sort(reverse=True)
        return {
            "counts_per_task": per_task,
            "pg_statements": stmts,
            "pg_functions": [
                {"name": text, "self_us_per_task": 1e3 * ms / n, "calls_per_task": calls / n}
                for ms, calls, _, text in funcs
            ],
            "pg_calls_per_task": sum(c for _, c, _, text in rows if not text.startswith("(nested)")) / n,
            "pg_exec_ms_per_task": sum(ms for ms, _, _, text in rows if not text.startswith("(nested)")) / n,
        }


def show(rec: dict[str, Any]) -> str:
    """The counts of one record as text (the bench prints it under the run's line)."""
    lines = [f"  counts per task ({rec.get('system')}):"]
    for k, v in (rec.get("counts_per_task") or {}).items():
        lines.append(f"    {k:<60} {v:8.3f}")
    if rec.get("pg_statements"):
        calls, ms = rec["pg_calls_per_task"], rec["pg_exec_ms_per_task"]
        lines.append(f"  PostgreSQL: {calls:.2f} statements, {ms:.3f} ms exec per task")
        for s in rec["pg_statements"]:
            us, n, rows = s["us_per_task"], s["calls_per_task"], s["rows_per_call"]
            lines.append(f"    {us:7.1f} us {n:6.3f} calls {rows:6.1f} rows  {s['query'][:160]}")
    return "\n".join(lines)
