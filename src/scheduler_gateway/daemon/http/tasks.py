"""Task routes: create (one or a batch), list, get, history, and the user actions (cancel, approve, amend, retry,
rework)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.model.records import HistoryEntry, Task, TaskError
from scheduler_gateway.actors.ports import (
    TaskQuery,
)
from scheduler_gateway.actors.tasks import BatchItem, Caller, NewTask, TaskService, spec_of
from scheduler_gateway.daemon.http import task_spans
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.callback_client import target_host, target_problem
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.daemon.http.input import MAX_JSON_DEPTH, check_json_depth, idempotency_key
from scheduler_gateway.daemon.http.requests import (
    Bodies,
    canonical_hash,
    decode_body,
    page_args,
    task_id_arg,
    value_hash,
)
from scheduler_gateway.daemon.http.settings import HttpSettings
from scheduler_gateway.wire import api
from scheduler_gateway.wire.errors import (
    GatewayError,
    InvalidArgument,
    PayloadTooLarge,
)
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.timefmt import fmt_ts

TASK_STATES = ("waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")


def _item_error(exc: GatewayError) -> api.BatchItemResult:
    return api.BatchItemResult(
        status=STATUS_OF_CODE.get(exc.code, 500),
        error=api.BatchItemError(code=exc.code, message=exc.message, details=exc.details),
    )


def task_view(t: Task, waiting_for: str | None = None, artifact_count: int = 0) -> api.TaskView:
    return api.TaskView(
        id=t.id,
        kind=t.kind,
        payload=t.payload,
        state=t.state,
        revision=t.revision,
        priority=t.priority,
        attempt_no=t.attempt_no,
        max_attempts=t.max_attempts,
        attempt_id=t.attempt_id,
        lease_id=t.lease_id,
        lease_expires_at=fmt_ts(t.lease_expires_at),
        node_id=t.node_id,
        run_id=t.run_id,
        parent_id=t.parent_id,
        thread_id=t.thread_id,
        requires_approval=t.requires_approval,
        has_callback=t.callback_url is not None,
        labels=t.labels,
        owner=t.owner,
        result=t.result,
        error=error_view(t.error) if t.error else None,
        not_before=fmt_ts(t.not_before),
        created_at=fmt_ts(t.created_at),
        updated_at=fmt_ts(t.updated_at),
        started_at=fmt_ts(t.started_at),
        finished_at=fmt_ts(t.finished_at),
        traceparent=t.traceparent,
        concurrency_key=t.concurrency_key,
        unique_key=t.unique_key,
        waiting_for=waiting_for,
        artifact_count=artifact_count,
        attempt_in_budget=t.attempts_in_budget,
        workflow_id=t.workflow_id,
        ref=t.ref,
        depends_on=[api.DependsOnView(ref=d.ref, on=d.on) for d in t.depends_on],
    )


def error_view(e: TaskError) -> api.ErrorView:
    """A task's error as answered, with its ``details`` when it has some (a skip names its parent: 2.12)."""
    return api.ErrorView(e.code, e.message, e.details or None)


def check_callback(settings: HttpSettings, url: str | None, secret: str | None) -> None:
    """The create rules of a ``callbackUrl`` and its ``callbackSecret`` that ``[http]`` decides (a task's, a
    workflow's): 400 INVALID_ARGUMENT with ``details.field``."""
    if secret is not None and url is None:
        raise InvalidArgument("callbackSecret needs a callbackUrl", details={"field": "callbackSecret"})
    if url is None:
        return
    if target_host(url) is None:
        raise InvalidArgument("callbackUrl must be an http or https URL", details={"field": "callbackUrl"})
    # a name is checked on its resolved address at each delivery; a literal IP (as the HTTP client reads the host,
    # full-width digits folded) can be refused now
    problem = None if settings.allow_private_networks else target_problem(url)
    if problem is not None:
        raise InvalidArgument(f"callbackUrl points at {problem}", details={"field": "callbackUrl"})
    if not secret and not settings.callback_secret_configured:
        raise InvalidArgument(
            "a callbackUrl needs a callbackSecret (no [callbacks] secret is configured)",
            details={"field": "callbackSecret"},
        )


def new_task(settings: HttpSettings, req: api.CreateTaskBody) -> NewTask:
    """What a create body asks, held to the rules the HTTP layer knows (a timestamp, a callback by ``[http]``); the
    payload's size is the caller's (``Bodies.check_payload``)."""
    spec = spec_of(req)
    if req.parent_id is not None and not is_id(req.parent_id, "tsk"):
        raise InvalidArgument("parentId is not a task id", details={"field": "parentId"})
    check_callback(settings, req.callback_url, req.callback_secret)
    return spec


def create_rule(bodies: Bodies, settings: HttpSettings) -> Callable[[api.CreateTaskBody], NewTask]:
    """A single create's rules at this door (the payload's size, then ``new_task``), for the tasks of a workflow
    (submitted or added by a running task) that the workflow service decodes itself."""

    def rule(req: api.CreateTaskBody) -> NewTask:
        bodies.check_payload(req.payload)
        return new_task(settings, req)

    return rule


def history_view(h: HistoryEntry) -> api.HistoryView:
    return api.HistoryView(
        from_=h.from_state,
        to=h.to_state,
        action=h.action,
        actor=api.ActorView(h.actor.type, h.actor.id),
        reason=h.reason,
        at=fmt_ts(h.at),
        attempt_id=h.attempt_id,
        attempt_no=h.attempt_no,
        lease_id=h.lease_id,
        node_id=h.node_id,
        request_id=h.request_id,
        revision=h.revision,
    )


class TaskRoutes:
    """The task routes, given the body limits, the ``[http]`` settings a create is checked against, and the task
    service."""

    def __init__(self, bodies: Bodies, settings: HttpSettings, service: TaskService) -> None:
        self.bodies = bodies
        self.settings = settings
        self.service = service

    def _view(self, task: Task, artifact_count: int = 0) -> api.TaskView:
        return task_view(task, self.service.waiting_for(task), artifact_count)

    async def _counted(self, task: Task) -> api.TaskView:
        """The view with its ``artifactCount`` read from the artifact index (docs/ARTIFACTS.md)."""
        return self._view(task, (await self.service.artifact_counts([task.id])).get(task.id, 0))

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/api/tasks", self.create_task)
        r.add_post("/api/tasks/batch", self.create_tasks_batch)
        r.add_get("/api/tasks", self.list_tasks)
        r.add_get("/api/tasks/{id}", self.get_task)
        r.add_get("/api/tasks/{id}/history", self.task_history)
        for action in ("cancel", "approve", "amend", "retry", "rework"):
            r.add_post(f"/api/tasks/{{id}}/{action}", self._action_handler(action))

    async def create_task(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        body = await self.bodies.read(request)
        req: api.CreateTaskBody = decode_body(body, api.CreateTaskBody)
        self.bodies.check_payload(req.payload)
        spec = self._new_task(req)
        key = idempotency_key(request.headers.get("Idempotency-Key"))
        with task_spans.create_span(caller, spec, request.headers.get("traceparent")) as (spec, span):
            task, replayed = await self.service.create(caller, spec, key, canonical_hash(body) if key else "")
            task_spans.created(span, task.id, replayed)
        if replayed:
            return json_response(self._view(task), 200, {"Idempotent-Replayed": "true"})
        failpoints.hit("http.after_commit")  # committed, not answered
        return json_response(self._view(task), 201)

    async def create_tasks_batch(self, request: web.Request) -> web.Response:
        """``POST /api/tasks/batch``: 1 to 1000 creates, each answered alone, all accepted ones committed."""
        caller: Caller = request[CALLER]
        limit = api.BATCH_MAX_BYTES
        # {"tasks": [item, ...]} wraps each item two levels deep; each item is held to the limit alone, as a
        # create sent alone is, so one item too deep fails alone. The request as a whole is bounded still (twice
        # the limit: past that the decoder is not asked to read it)
        body = await self.bodies.read(request.clone(client_max_size=limit), limit, depth=2 * MAX_JSON_DEPTH)
        batch: api.BatchCreateBody = decode_body(body, api.BatchCreateBody)
        if len(batch.tasks) > api.BATCH_MAX_ITEMS:
            raise PayloadTooLarge(
                f"a batch holds at most {api.BATCH_MAX_ITEMS} tasks", details={"limit": api.BATCH_MAX_ITEMS}
            )
        if not batch.tasks:
            raise InvalidArgument("a batch holds at least one task", details={"field": "tasks"})
        answers: list[api.BatchItemResult | None] = [None] * len(batch.tasks)
        items: list[BatchItem] = []
        slots: list[int] = []
        for n, raw in enumerate(batch.tasks):
            try:
                items.append(self._batch_item(raw))
                slots.append(n)
            except GatewayError as exc:
                answers[n] = _item_error(exc)
        with task_spans.create_spans(caller, items, request.headers.get("traceparent")) as (items, spans):
            outcomes = await self.service.create_many(caller, items)
            task_spans.batch_created(spans, outcomes)
        for n, outcome in zip(slots, outcomes, strict=True):
            if isinstance(outcome, GatewayError):
                answers[n] = _item_error(outcome)
            else:
                task, replayed = outcome
                answers[n] = api.BatchItemResult(
                    status=200 if replayed else 201, task=self._view(task), replayed=replayed
                )
        failpoints.hit("http.after_commit")  # committed, not answered
        return json_response(api.BatchCreateAnswer(items=[a for a in answers if a is not None]))

    def _batch_item(self, raw: msgspec.Raw) -> BatchItem:
        check_json_depth(bytes(raw))
        item: api.BatchItemBody = decode_body(bytes(raw), api.BatchItemBody)
        self.bodies.check_payload(item.payload)
        spec = self._new_task(item)
        key = idempotency_key(item.idempotency_key)
        if key is None:
            return BatchItem(spec)
        # the hash covers the item without its key: the same create sent alone with that key replays
        value = msgspec.json.decode(bytes(raw))
        value.pop("idempotencyKey", None)
        return BatchItem(spec, key, value_hash(value))

    def _new_task(self, req: api.CreateTaskBody) -> NewTask:
        return new_task(self.settings, req)

    async def list_tasks(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit, cursor = page_args(request)
        q = request.query
        state = q.get("state") or None
        if state is not None and state not in TASK_STATES:
            raise InvalidArgument(f"unknown state {state[:40]}", details={"field": "state"})
        order = q.get("order") or "oldest"
        if order not in ("oldest", "newest"):
            raise InvalidArgument("order must be oldest or newest", details={"field": "order"})
        items, next_cursor = await self.service.list_tasks(
            caller,
            TaskQuery(
                state=state,
                kind=q.get("kind") or None,
                parent_id=q.get("parentId") or None,
                run_id=q.get("runId") or None,
                workflow_id=q.get("workflowId") or None,
                limit=limit,
                cursor=cursor,
                newest_first=order == "newest",
            ),
        )
        counts = await self.service.artifact_counts([t.id for t in items])
        return json_response(api.ListView([self._view(t, counts.get(t.id, 0)) for t in items], next_cursor))

    async def get_task(self, request: web.Request) -> web.Response:
        task = await self.service.get(request[CALLER], task_id_arg(request))
        return json_response(await self._counted(task))

    async def task_history(self, request: web.Request) -> web.Response:
        limit, cursor = page_args(request)
        items, next_cursor = await self.service.history(request[CALLER], task_id_arg(request), limit, cursor)
        return json_response(api.ListView([history_view(h) for h in items], next_cursor))

    def _action_handler(self, action: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        body_type: type[Any] = {
            "cancel": api.CancelBody,
            "approve": api.RevisionBody,
            "retry": api.RevisionBody,
            "amend": api.AmendBody,
            "rework": api.ReworkBody,
        }[action]

        async def handle(request: web.Request) -> web.Response:
            caller: Caller = request[CALLER]
            task_id = task_id_arg(request)
            body = await self.bodies.read(request)
            req = decode_body(body, body_type)
            payload = getattr(req, "payload", None)
            if payload is not None and len(payload) == 0:  # api.ABSENT: not sent
                payload = None
            self.bodies.check_payload(payload)
            key = idempotency_key(request.headers.get("Idempotency-Key")) if action != "cancel" else None
            task, repeated = await self.service.act(
                caller,
                task_id,
                action,
                expected_revision=req.expected_revision,
                reason=getattr(req, "reason", None),
                payload=payload,
                idem_key=key,
                body_hash=canonical_hash(body) if key else "",
            )
            if not repeated:
                failpoints.hit("http.after_commit")  # committed, not answered
            headers = {"Idempotent-Replayed": "true"} if repeated and key else None
            return json_response(await self._counted(task), 200, headers)

        return handle
