"""Workflows on the outside (CONTRACT 2.12, docs/WORKFLOWS.md): the HTTP bodies and views, and the node's
workflow requests on ``gw.workflow.<nodeId>`` (a handler's ``ctx.dependencies`` and ``ctx.add_tasks``).

A workflow's tasks arrive as raw items (``msgspec.Raw``) so that the gateway decodes each alone and names the
item (``details.ref``) whose entry is wrong; one item decodes as ``WorkflowTaskBody``: a task body of 2.1
(``CreateTaskBody``) with ``ref``, ``dependsOn`` and ``join``. A ref is ``[A-Za-z0-9_.-]{1,64}``, matched whole.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from .api import CreateTaskBody, ErrorView, Reason
from .artifacts import ArtifactInfo
from .raw import NULL

#: a task's ref in its workflow: one whole match
REF_PATTERN: Final = r"\A[A-Za-z0-9_.-]{1,64}\Z"
REF_RULE: Final = "a ref is 1 to 64 of A-Z a-z 0-9 _ . -"
_REF: Final = re.compile(REF_PATTERN)
#: the most tasks one workflow submit carries, and one ``add_tasks`` call
MAX_WORKFLOW_TASKS: Final = 10_000
MAX_ADDED_TASKS: Final = 1_000
#: the most dependencies one ``gw.workflow`` reply carries (a page; the SDK follows ``next``)
DEPENDENCY_PAGE: Final = 200

Ref = Annotated[str, Meta(min_length=1, max_length=64, pattern=REF_PATTERN)]
EdgeOn = Literal["succeeded", "failed", "finished"]
Join = Literal["all", "any"]
WorkflowName = Annotated[str, Meta(min_length=1, max_length=200)]


def is_ref(value: object) -> bool:
    return isinstance(value, str) and _REF.fullmatch(value) is not None


class _Body(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    pass


class DependsOn(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One edge into a task: the parent's ref and the state it must end in (``finished``: any terminal state)."""

    ref: Ref
    on: EdgeOn = "succeeded"


class WorkflowTaskBody(CreateTaskBody, forbid_unknown_fields=True, kw_only=True):
    """One task of a workflow: a task body of 2.1 (``parentId`` refused: the graph replaces it) and its place."""

    ref: Ref
    depends_on: list[DependsOn] = msgspec.field(default_factory=list)
    join: Join = "all"


class CreateWorkflowBody(_Body, kw_only=True):
    name: WorkflowName | None = None
    labels: dict[Annotated[str, Meta(min_length=1, max_length=128)], Annotated[str, Meta(max_length=1024)]] = {}
    max_parallel: Annotated[int, Meta(ge=1)] | None = None
    callback_url: Annotated[str, Meta(max_length=2048)] | None = None
    callback_secret: Annotated[str, Meta(max_length=1024)] | None = None
    #: each item a ``WorkflowTaskBody``, decoded alone (``details.ref`` names a wrong one)
    tasks: list[msgspec.Raw]

    def __repr__(self) -> str:  # the callback secret never reaches a log
        return f"CreateWorkflowBody(name={self.name!r}, tasks={len(self.tasks)})"


class WorkflowCancelBody(_Body, kw_only=True):
    reason: Reason | None = None


class WorkflowRetryBody(_Body, kw_only=True):
    #: the refs to run again (default: every task that ended failed, dead or canceled)
    refs: list[Ref] | None = None


class WorkflowCounts(msgspec.Struct, rename="camel", kw_only=True):
    waiting: int = 0
    waiting_approval: int = 0
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    canceled: int = 0
    dead: int = 0


class WorkflowTaskView(msgspec.Struct, rename="camel", kw_only=True):
    ref: str
    task_id: str
    state: str
    depends_on: list[DependsOn]
    join: Join


class WorkflowView(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """A workflow as answered; ``tasks`` is left out of the list route (None)."""

    id: str
    name: str | None
    state: Literal["running", "succeeded", "failed", "canceled"]
    labels: dict[str, str]
    max_parallel: int | None
    owner: str
    counts: WorkflowCounts
    created_at: str | None
    updated_at: str | None
    finished_at: str | None
    has_callback: bool = False
    tasks: list[WorkflowTaskView] | None = None


class WorkflowPage(msgspec.Struct, rename="camel", kw_only=True):
    items: list[WorkflowView]
    next_cursor: str | None = None


class WorkflowCallbackBody(msgspec.Struct, rename="camel", kw_only=True):
    """The body of a workflow's callback (2.5 rules; ``X-Callback-Id: <workflowId>:<n>``)."""

    workflow_id: str
    state: str
    counts: WorkflowCounts
    finished_at: str | None


# -- the node's requests on gw.workflow.<nodeId> ------------------------------------------------------------


class _Wire(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    pass


class DependenciesRequest(_Wire, tag="dependencies", tag_field="op", kw_only=True):
    """A page of the parents of the task the node holds under ``leaseId`` (``after``: the last ref of the page
    before, parents in ref order)."""

    task_id: str
    lease_id: str
    after: str | None = None
    limit: int = DEPENDENCY_PAGE


class AddTasksRequest(_Wire, tag="add_tasks", tag_field="op", kw_only=True):
    """Tasks the running task adds to its workflow, under its lease; each item a ``WorkflowTaskBody``."""

    task_id: str
    lease_id: str
    tasks: list[msgspec.Raw]


WorkflowRequest = DependenciesRequest | AddTasksRequest


class DependencyView(msgspec.Struct, rename="camel", kw_only=True):
    """One parent as its dependent sees it: its state then, its result and error, and its artifacts."""

    ref: str
    task_id: str
    state: str
    on: EdgeOn
    result: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)
    error: ErrorView | None = None
    artifacts: list[ArtifactInfo] = []


class DependenciesReply(_Wire, kw_only=True):
    ok: bool = True
    dependencies: list[DependencyView] = []
    next: str | None = None
    error: dict[str, Any] | None = None  # {code, message, details?} when ok is false


class AddedTask(msgspec.Struct, rename="camel", kw_only=True):
    ref: str
    task_id: str


class AddTasksReply(_Wire, kw_only=True):
    ok: bool = True
    tasks: list[AddedTask] = []
    replayed: bool = False
    error: dict[str, Any] | None = None  # {code, message, details?} when ok is false
