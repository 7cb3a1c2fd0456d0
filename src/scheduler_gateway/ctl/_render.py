"""What ``gatewayctl`` prints: the API's JSON (``--output json``), aligned columns (``table``), and progress on
stderr while a long list or a wait goes on, only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, Final

import msgspec

_encode = msgspec.json.Encoder().encode
MAX_CELL: Final = 60


def as_dict(view: Any) -> dict[str, Any]:
    """A view as the JSON object the API sent (camelCase keys), decoded."""
    value = msgspec.json.decode(_encode(view))
    return value if isinstance(value, dict) else {"value": value}


def json_line(view: Any) -> str:
    """The API's JSON of one object, on one line."""
    return _encode(view).decode()


def cell(value: Any, width: int = MAX_CELL) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, dict | list):
        text = _encode(value).decode() if value else "-"
    else:
        text = str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def key(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row.get(name)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], out: IO[str]) -> None:
    """Aligned columns under upper-case headers; ``-`` for nothing."""
    cells = [[cell(get(r)) for _, get in columns] for r in rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, (h, _) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (h, _), w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    out.write("\n".join(lines) + "\n")


def record(row: dict[str, Any], out: IO[str]) -> None:
    """One object as two columns, field and value, in the API's order."""
    width = max((len(k) for k in row), default=0)
    for k, v in row.items():
        out.write(f"{k.ljust(width)}  {cell(v, 200)}\n")


#: the message column's width in tables: enough to say what went wrong, the whole text is one ``get`` away
MESSAGE_CELL: Final = 48

#: what each ``waitingFor`` means, for a person (CONTRACT 2.1)
WAITING: Final[dict[str, str]] = {
    "approval": "waits for an approval",
    "not_before": "waits for its notBefore time",
    "thread": "waits for the task before it in its thread",
    "kind_paused": "its kind is paused (gatewayctl kinds resume KIND)",
    "kind_concurrency": "its kind's concurrency limit is reached",
    "key_concurrency": "its concurrency key's limit is reached",
    "kind_rate": "its kind's rate limit is reached",
    "key_rate": "its concurrency key's rate limit is reached",
    "retry_backoff": "waits to retry after a failed attempt",
    "dependencies": "waits for the tasks it depends on",
    "workflow_parallel": "waits for a free slot of its workflow",
    "no_node": "no node serves this kind: start a worker with --kinds KIND (or check the kind for a typo)",
}


def _error(row: dict[str, Any], field: str = "error") -> Any:
    err = row.get(field)
    return err.get("code") if isinstance(err, dict) else None


def _message(field: str = "error") -> Callable[[dict[str, Any]], Any]:
    def get(row: dict[str, Any]) -> Any:
        err = row.get(field)
        text = err.get("message") if isinstance(err, dict) else None
        return cell(text, MESSAGE_CELL) if text else None

    return get


def _task_note(row: dict[str, Any]) -> Any:
    return _error(row) or row.get("waitingFor")


def _task_message(row: dict[str, Any]) -> Any:
    waiting = row.get("waitingFor")
    if not _error(row) and waiting:
        return cell(WAITING.get(waiting, waiting), MESSAGE_CELL)
    return _message()(row)


def attempts(row: dict[str, Any]) -> str:
    """``2/3``: the second attempt of a budget of three; ``1/2 (7 in all)`` once the task was retried or redriven
    (``attemptNo`` counts every attempt of its life, ``maxAttempts`` only those since the last fresh budget)."""
    total, budget = row.get("attemptNo"), row.get("maxAttempts")
    this = row.get("attemptInBudget", total)
    text = f"{this}/{budget}"
    return text if this == total else f"{text} ({total} in all)"


def explain(row: dict[str, Any]) -> dict[str, Any]:
    """A task for ``tasks get -O table``: its fields, ``attempt`` spelled out and ``waitingFor`` said plainly."""
    out = dict(row)
    if "attemptNo" in row and "maxAttempts" in row:
        this = row.get("attemptInBudget", row["attemptNo"])
        spelled = f"attempt {this} of {row['maxAttempts']} in this budget"
        if this != row["attemptNo"]:
            spelled += f"; {row['attemptNo']} attempts in all (retries and redrives start a fresh budget)"
        out["attempts"] = spelled
    waiting = row.get("waitingFor")
    if waiting:
        out["waitingFor"] = f"{waiting}: {WAITING.get(waiting, waiting)}"
    return out


def _rate(name: str) -> Callable[[dict[str, Any]], Any]:
    def get(row: dict[str, Any]) -> Any:
        r = row.get(name)
        return f"{r.get('limit')}/{r.get('periodSeconds')}s" if isinstance(r, dict) else None

    return get


def _count(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: (row.get("counts") or {}).get(name)


def _actor(row: dict[str, Any]) -> Any:
    a = row.get("actor")
    return f"{a.get('type')}:{a.get('id')}" if isinstance(a, dict) else None


COLUMNS: Final[dict[str, list[Column]]] = {
    "task": [
        ("ID", key("id")),
        ("KIND", key("kind")),
        ("STATE", key("state")),
        ("ATTEMPT", attempts),
        ("PRIORITY", key("priority")),
        ("OWNER", key("owner")),
        ("CREATED", key("createdAt")),
        ("NOTE", _task_note),
        ("MESSAGE", _task_message),
    ],
    "history": [
        ("REV", key("revision")),
        ("AT", key("at")),
        ("ACTION", key("action")),
        ("FROM", key("from")),
        ("TO", key("to")),
        ("ACTOR", _actor),
        ("ATTEMPT", key("attemptNo")),
        ("NODE", key("nodeId")),
        ("REASON", key("reason")),
    ],
    "dead_letter": [
        ("ID", key("deadLetterId")),
        ("TASK", key("taskId")),
        ("KIND", key("kind")),
        ("REASON", key("deadReason")),
        ("RETRIES", key("retryCount")),
        ("EXHAUSTED", key("exhausted")),
        ("LAST DEAD", key("lastDeadAt")),
        ("ERROR", lambda r: _error(r, "lastError")),
        ("MESSAGE", _message("lastError")),
    ],
    "run": [
        ("ID", key("id")),
        ("TRIGGER", key("trigger")),
        ("STATUS", key("status")),
        ("SCHEDULED FOR", key("scheduledFor")),
        ("TASK", key("taskId")),
        ("FINISHED", key("finishedAt")),
        ("ERROR", _error),
        ("MESSAGE", _message()),
    ],
    "time": [("NEXT RUN", key("at"))],
    "schedule": [
        ("ID", key("id")),
        ("TITLE", key("title")),
        ("STATUS", key("status")),
        ("KIND", lambda r: (r.get("task") or {}).get("kind")),
        ("NEXT RUN", key("nextRunAt")),
        ("LAST RUN", key("lastRunAt")),
        ("LAST STATUS", key("lastRunStatus")),
        ("RUNS", key("runCount")),
    ],
    "kind": [
        ("KIND", key("kind")),
        ("PAUSED", key("paused")),
        ("CONCURRENCY", key("concurrency")),
        ("KEY CONC", key("keyConcurrency")),
        ("RATE", _rate("rate")),
        ("KEY RATE", _rate("keyRate")),
        ("QUEUED", _count("queued")),
        ("RUNNING", _count("running")),
        ("APPROVAL", _count("waitingApproval")),
        ("NODES", lambda r: r.get("onlineNodes") or "none"),
    ],
    "node": [
        ("ID", key("id")),
        ("STATUS", key("status")),
        ("KINDS", lambda r: ",".join(r.get("kinds") or [])),
        ("LEASES", key("activeLeases")),
        ("LAST HEARTBEAT", key("lastHeartbeatAt")),
        ("HOST", key("host")),
        ("PID", key("pid")),
        ("VERSION", key("version")),
    ],
    "artifact": [
        ("NAME", key("name")),
        ("SIZE", key("size")),
        ("TYPE", key("contentType")),
        ("ATTEMPT", key("attemptNo")),
        ("NODE", key("nodeId")),
        ("CREATED", key("createdAt")),
        ("SHA256", lambda r: (r.get("sha256") or "")[:16] or None),
    ],
}


#: ``events tail -O table``: the columns and their widths (events stream, so the widths are fixed beforehand: a
#: seq to a billion, a millisecond timestamp, the longest event type, an id); a longer value pushes its line only
EVENT_COLUMNS: Final = (("SEQ", 9), ("AT", 24), ("TYPE", 22), ("OBJECT", 30), ("REV", 4), ("CHANGE", 0))


def event_header() -> str:
    return "  ".join(name.ljust(width) for name, width in EVENT_COLUMNS).rstrip()


def event_line(row: dict[str, Any]) -> str:
    """One event as a table row under ``event_header``; a state change reads ``queued -> running`` (a new
    object's first state: ``(new) -> queued``)."""
    data = row.get("data")
    change = ""
    if isinstance(data, dict) and ("from" in data or "to" in data):
        change = f"{data.get('from') or '(new)'} -> {data.get('to') or '-'}"
    values = (row.get("seq"), row.get("at"), row.get("type"), row.get("aggregateId"), row.get("revision"), change)
    return "  ".join(
        cell(None if v == "" else v).ljust(width) for v, (_, width) in zip(values, EVENT_COLUMNS, strict=True)
    ).rstrip()


class Progress:
    """One line on stderr, rewritten in place, while stderr is a terminal; nothing otherwise."""

    def __init__(self, stream: IO[str] | None = None, *, interval_s: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s
        self._last = 0.0
        self._shown = False

    def show(self, text: str, *, force: bool = False) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self.on and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
