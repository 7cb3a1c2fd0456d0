"""Workflow routes (CONTRACT 2.12, docs/API.md Workflows): submit, list, read, cancel and retry, each a call on
the workflow service (actors/workflows/service.py), which owns every rule of a workflow.

What is checked here is what the HTTP layer reads: the body's size (64 MiB for a submit, the batch's limit,
while every other route keeps its own), its JSON depth, the ``Idempotency-Key`` header and the hash of the body
it covers, and a workflow id in a path (``wfl_`` and the id alphabet, matched whole: anything else is 404
WORKFLOW_NOT_FOUND, as a missing or another user's workflow is). Each task item is decoded and held to a single
create's rules by the service, with the HTTP layer's own rules given to it by the gateway
(``tasks.create_rule``: the payload's size, the callback URL by ``[http]``), and a refusal names the item's
``details.ref``. A viewer's write is refused before any handler runs (console/viewer.py).
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.input import MAX_JSON_DEPTH, idempotency_key
from scheduler_gateway.daemon.http.requests import Bodies, canonical_hash, decode_body, page_args
from scheduler_gateway.daemon.http.settings import HttpSettings
from scheduler_gateway.wire import api
from scheduler_gateway.wire.errors import Code, InvalidArgument, NotFound, Unavailable
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.workflows import (
    CreateWorkflowBody,
    WorkflowCancelBody,
    WorkflowPage,
    WorkflowRetryBody,
    WorkflowView,
)

#: a workflow's states, the list's ``?state=`` filter (CONTRACT 2.12)
WORKFLOW_STATES = ("running", "succeeded", "failed", "canceled")
#: the largest submit body: the batch's limit (a workflow carries up to 10,000 task bodies)
MAX_WORKFLOW_BYTES = api.BATCH_MAX_BYTES
#: the longest ``?name=``: a workflow's name is 1 to 200 characters
MAX_NAME = 200
WORKFLOW_PREFIX = "wfl"


class WorkflowApi(Protocol):
    """What the routes call: the workflow service's HTTP half (actors/workflows/service.py)."""

    async def submit(
        self, caller: Caller, body: CreateWorkflowBody, *, idempotency_key: str | None, body_hash: str,
        request_id: str | None,
    ) -> tuple[WorkflowView, bool]: ...  # fmt: skip

    async def get(self, caller: Caller, workflow_id: str) -> WorkflowView: ...

    async def list(
        self, caller: Caller, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> WorkflowPage: ...

    async def cancel_with_replay(
        self, caller: Caller, workflow_id: str, body: WorkflowCancelBody, *, idempotency_key: str | None,
        body_hash: str, request_id: str | None,
    ) -> tuple[WorkflowView, bool]: ...  # fmt: skip

    async def retry_with_replay(
        self, caller: Caller, workflow_id: str, body: WorkflowRetryBody, *, idempotency_key: str | None,
        body_hash: str, request_id: str | None,
    ) -> tuple[WorkflowView, bool]: ...  # fmt: skip


def workflow_id_arg(request: web.Request) -> str:
    """The path's ``{id}`` as a workflow id; one that cannot be a workflow id answers 404 like a missing one."""
    workflow_id = request.match_info["id"]
    if not is_id(workflow_id, WORKFLOW_PREFIX):
        raise NotFound(f"workflow {workflow_id[:80]} not found", code=Code.WORKFLOW_NOT_FOUND)
    return workflow_id


class WorkflowRoutes:
    """The workflow routes, given the body limits, the ``[http]`` settings and the workflow service (None: the
    routes exist, and answer 503, as in the document's unit test with no gateway behind it)."""

    def __init__(self, bodies: Bodies, settings: HttpSettings, service: WorkflowApi | None) -> None:
        self.bodies = bodies
        self.settings = settings
        self._service = service

    @property
    def service(self) -> WorkflowApi:
        if self._service is None:
            raise Unavailable("workflows are not served here")
        return self._service

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/api/workflows", self.submit)
        r.add_get("/api/workflows", self.list_workflows)
        r.add_get("/api/workflows/{id}", self.get_workflow)
        r.add_post("/api/workflows/{id}/cancel", self.cancel)
        r.add_post("/api/workflows/{id}/retry", self.retry)

    async def submit(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit = MAX_WORKFLOW_BYTES
        # {"tasks": [item, ...]}: an item is two levels down, and is held to the depth a task body has alone
        body = await self.bodies.read(request.clone(client_max_size=limit), limit, depth=MAX_JSON_DEPTH + 2)
        req: CreateWorkflowBody = decode_body(body, CreateWorkflowBody)
        key = idempotency_key(request.headers.get("Idempotency-Key"))
        body_hash = canonical_hash(body) if key else ""
        view, replayed = await self.service.submit(
            caller, req, idempotency_key=key, body_hash=body_hash, request_id=caller.request_id
        )
        if replayed:
            return json_response(view, 200, {"Idempotent-Replayed": "true"})
        failpoints.hit("http.after_commit")  # committed, not answered
        return json_response(view, 201)

    async def list_workflows(self, request: web.Request) -> web.Response:
        limit, cursor = page_args(request)
        state = request.query.get("state") or None
        if state is not None and state not in WORKFLOW_STATES:
            raise InvalidArgument(f"unknown state {state[:40]}", details={"field": "state"})
        name = request.query.get("name") or None
        if name is not None and len(name) > MAX_NAME:
            raise InvalidArgument(f"a workflow's name is at most {MAX_NAME} characters", details={"field": "name"})
        page = await self.service.list(request[CALLER], state=state, name=name, limit=limit, cursor=cursor)
        return json_response(page)

    async def get_workflow(self, request: web.Request) -> web.Response:
        return json_response(await self.service.get(request[CALLER], workflow_id_arg(request)))

    async def _action_args(self, request: web.Request) -> tuple[Caller, str, bytes, str | None, str]:
        """The caller, the path's workflow id, the body, the ``Idempotency-Key`` and the hash it covers."""
        caller: Caller = request[CALLER]
        workflow_id = workflow_id_arg(request)
        body = await self.bodies.read(request)
        key = idempotency_key(request.headers.get("Idempotency-Key"))
        return caller, workflow_id, body, key, canonical_hash(body) if key else ""

    async def cancel(self, request: web.Request) -> web.Response:
        caller, workflow_id, body, key, body_hash = await self._action_args(request)
        req: WorkflowCancelBody = decode_body(body, WorkflowCancelBody)
        view, replayed = await self.service.cancel_with_replay(
            caller, workflow_id, req, idempotency_key=key, body_hash=body_hash, request_id=caller.request_id
        )
        failpoints.hit("http.after_commit")  # committed, not answered
        return json_response(view, 200, {"Idempotent-Replayed": "true"} if replayed else None)

    async def retry(self, request: web.Request) -> web.Response:
        caller, workflow_id, body, key, body_hash = await self._action_args(request)
        req: WorkflowRetryBody = decode_body(body, WorkflowRetryBody)
        view, replayed = await self.service.retry_with_replay(
            caller, workflow_id, req, idempotency_key=key, body_hash=body_hash, request_id=caller.request_id
        )
        failpoints.hit("http.after_commit")  # committed, not answered
        return json_response(view, 200, {"Idempotent-Replayed": "true"} if replayed else None)
