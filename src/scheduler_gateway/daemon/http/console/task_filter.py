"""The console's task list filter, as the URL carries it (so a reload or a shared link shows the same list), the
store's search it becomes for a caller, and a task as its list row shows it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.ports import TaskSearch
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.console.pages.base import STATES
from scheduler_gateway.wire.errors import InvalidArgument

#: the list's filters as URL parameters (``state`` may repeat, or list states with commas)
FILTER_FIELDS = (
    "state",
    "kind",
    "owner",
    "node",
    "errorCode",
    "label",
    "concurrencyKey",
    "parentId",
    "runId",
    "threadId",
    "workflowId",
    "createdFrom",
    "createdTo",
    "id",
)


class TaskFilter(msgspec.Struct, kw_only=True):
    """The task list's filter, as the URL carries it (so a reload or a shared link shows the same list)."""

    states: tuple[str, ...] = ()
    kind: str | None = None
    owner: str | None = None  # admin and viewer only; a user's list is its own
    node: str | None = None
    error_code: str | None = None
    label: str | None = None  # key=value
    concurrency_key: str | None = None
    parent_id: str | None = None
    run_id: str | None = None
    thread_id: str | None = None
    workflow_id: str | None = None
    created_from: str | None = None  # datetime-local, UTC
    created_to: str | None = None
    id_prefix: str | None = None

    @classmethod
    def of(cls, data: Any) -> TaskFilter:
        def get(name: str) -> str | None:
            v = (data.get(name) or "").strip()
            return v[:200] or None

        raw_states = data.getall("state", []) if hasattr(data, "getall") else [data.get("state") or ""]
        states: list[str] = []
        for raw in raw_states:
            for st in str(raw).split(","):
                st = st.strip()
                if st and st not in states:
                    if st not in STATES:
                        raise InvalidArgument(f"unknown state {st[:40]}", details={"field": "state"})
                    states.append(st)
        label = get("label")
        if label is not None and "=" not in label:
            raise InvalidArgument("a label filter is key=value", details={"field": "label"})
        f = cls(
            states=tuple(s for s in STATES if s in states),
            kind=get("kind"),
            owner=get("owner"),
            node=get("node"),
            error_code=get("errorCode"),
            label=label,
            concurrency_key=get("concurrencyKey"),
            parent_id=get("parentId"),
            run_id=get("runId"),
            thread_id=get("threadId"),
            workflow_id=get("workflowId"),
            created_from=get("createdFrom"),
            created_to=get("createdTo"),
            id_prefix=get("id"),
        )
        f.bounds()  # refuse a malformed date now
        return f

    def query_args(self) -> dict[str, str]:
        pairs = {
            "state": ",".join(self.states),
            "kind": self.kind,
            "owner": self.owner,
            "node": self.node,
            "errorCode": self.error_code,
            "label": self.label,
            "concurrencyKey": self.concurrency_key,
            "parentId": self.parent_id,
            "runId": self.run_id,
            "threadId": self.thread_id,
            "workflowId": self.workflow_id,
            "createdFrom": self.created_from,
            "createdTo": self.created_to,
            "id": self.id_prefix,
        }
        return {k: v for k, v in pairs.items() if v}

    def text(self) -> str:
        args = self.query_args()
        return ", ".join(f"{k}={v}" for k, v in args.items()) or "all tasks"

    def bounds(self) -> tuple[float | None, float | None]:
        def parse(raw: str | None, field: str) -> float | None:
            if not raw:
                return None
            try:
                dt = datetime.fromisoformat(raw)
            except ValueError:
                raise InvalidArgument(f"{field} is not a date and time", details={"field": field}) from None
            return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()

        return parse(self.created_from, "createdFrom"), parse(self.created_to, "createdTo")

    def search(self, caller: Caller, **extra: Any) -> TaskSearch:
        """The store's query: a user's own tasks only, whatever ``owner`` says."""
        lo, hi = self.bounds()
        label = None
        if self.label:
            key, _, value = self.label.partition("=")
            label = (key.strip(), value.strip())
        return TaskSearch(
            owner=(self.owner if caller.is_admin else caller.user),
            states=self.states,
            kind=self.kind,
            node_id=self.node,
            error_code=self.error_code,
            label=label,
            concurrency_key=self.concurrency_key,
            parent_id=self.parent_id,
            run_id=self.run_id,
            thread_id=self.thread_id,
            workflow_id=self.workflow_id,
            created_from=lo,
            created_to=hi,
            id_prefix=self.id_prefix,
            **extra,
        )


class Row(msgspec.Struct, frozen=True):
    """A task as its list row shows it."""

    task: Task
    waiting_for: str | None
    last_attempt_s: float | None  # the duration of the last attempt (so far, while it runs)


def row_of(task: Task, waiting_for: str | None, now: float) -> Row:
    spent: float | None = None
    if task.started_at is not None:
        if task.state == "running":
            spent = now - task.started_at
        elif task.finished_at is not None and task.finished_at >= task.started_at:
            spent = task.finished_at - task.started_at
        elif task.state in ("queued", "failed", "dead") and task.updated_at >= task.started_at:
            spent = task.updated_at - task.started_at  # the attempt that failed
    return Row(task, waiting_for, spent)
