"""``TaskCalls``: the task calls of ``GatewayClient`` (docs/CLIENT.md, Tasks, Batches, Waiting, Events), each
one request (or a stream) over the client's ``Transport``: create (one or a batch), read, list, the actions,
``wait`` and the event stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from scheduler_gateway.wire import api

from ._batch import MAX_BATCH, submit_batches
from ._events import EventStream, wait_for
from ._http import Retry, _given, _id, _keyed, _new_key
from ._transport import Transport
from ._types import TERMINAL_STATES, SubmitResult, raw, timestamp

_NOT_SENT: Any = msgspec.Raw(b"")  # "no payload" in rework (a payload of null is raw(None))


class TaskCalls:
    """The calls on tasks, over ``transport`` (a part of ``GatewayClient``)."""

    transport: Transport

    # -- tasks -----------------------------------------------------------------------------------------
    @staticmethod
    def task_body(
        kind: str,
        payload: Any = None,
        *,
        priority: int = 0,
        max_attempts: int | None = None,
        retry_backoff_seconds: float = 1.0,
        lease_seconds: float | None = None,
        timeout_seconds: float | None = None,
        not_before: str | datetime | None = None,
        parent_id: str | None = None,
        thread_id: str | None = None,
        run_id: str | None = None,
        requires_approval: bool = False,
        callback_url: str | None = None,
        callback_secret: str | None = None,
        labels: Mapping[str, str] | None = None,
        concurrency_key: str | None = None,
        unique_key: str | None = None,
        unique_for_seconds: float | None = None,
        traceparent: str | None = None,
    ) -> api.CreateTaskBody:
        """A ``CreateTaskBody`` from Python values (``payload`` is encoded to JSON). ``concurrency_key`` and
        ``unique_key`` are flow control's (docs/FLOW.md)."""
        return api.CreateTaskBody(
            kind=kind,
            payload=raw(payload),
            priority=priority,
            max_attempts=max_attempts,
            retry_backoff_seconds=retry_backoff_seconds,
            lease_seconds=lease_seconds,
            timeout_seconds=timeout_seconds,
            not_before=timestamp(not_before),
            parent_id=parent_id,
            thread_id=thread_id,
            run_id=run_id,
            requires_approval=requires_approval,
            callback_url=callback_url,
            callback_secret=callback_secret,
            labels=dict(labels or {}),
            concurrency_key=concurrency_key,
            unique_key=unique_key,
            unique_for_seconds=unique_for_seconds,
            traceparent=traceparent,
        )

    async def submit(
        self,
        /,
        task: str | api.CreateTaskBody,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> api.TaskView:
        """Create a task: ``submit("echo", {"x": 1}, priority=5)`` (options as ``task_body``) or
        ``submit(CreateTaskBody(...))``. Sent with ``idempotency_key`` or a fresh one (a UUID of version 7), and
        retried with that same key after a lost answer or a 503, so it never creates two tasks."""
        if isinstance(task, str):
            body = self.task_body(task, payload, **options)
        else:
            if payload is not None or options:
                raise TypeError("give either a CreateTaskBody or a kind with its payload and options")
            body = task
        key = idempotency_key or _new_key()
        answer = await self.transport.call("POST", "/api/tasks", body=body, idempotency_key=key)
        return self.transport.decode(answer, api.TaskView)

    async def submit_many(
        self,
        tasks: Sequence[api.CreateTaskBody | Mapping[str, Any]],
        *,
        idempotency_keys: Sequence[str] | None = None,
        chunk_size: int = MAX_BATCH,
    ) -> list[SubmitResult]:
        """Create many tasks through ``POST /api/tasks/batch``, ``chunk_size`` (at most 1000) per request.
        Every item's ``idempotencyKey`` is settled before anything is sent (``idempotency_keys``, else the
        key an item carries, else a fresh one), so a chunk is retried whole after a lost answer or a 503 without
        creating anything twice. One ``SubmitResult`` per item, in order, with its key and ``outcome``:
        ``created``, ``replayed`` or ``refused`` (the item alone: an outcome, not an exception).
        A request that fails as a whole stops the call with ``SubmitManyError`` (also of the failure's own
        class) carrying every item's outcome and key; ``submit_many(e.items)`` replays what was made and
        creates only what is missing."""
        return await submit_batches(self.transport, tasks, idempotency_keys, chunk_size)

    async def get(self, task_id: str) -> api.TaskView:
        return await self.transport.get(f"/api/tasks/{_id(task_id)}", api.TaskView)

    def list_tasks(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        parent_id: str | None = None,
        run_id: str | None = None,
        workflow_id: str | None = None,
        page_size: int = 100,
        newest_first: bool = False,
    ) -> AsyncIterator[api.TaskView]:
        """Every task the caller sees, oldest first (``newest_first``: newest first), fetched page by page as the
        iteration goes (``workflow_id``: the tasks of one workflow)."""
        params = {
            "state": state,
            "kind": kind,
            "parentId": parent_id,
            "runId": run_id,
            "workflowId": workflow_id,
            "order": "newest" if newest_first else None,
        }
        return self.transport.pages("/api/tasks", api.TaskView, params, page_size)

    def history(self, task_id: str, *, page_size: int = 100) -> AsyncIterator[api.HistoryView]:
        return self.transport.pages(f"/api/tasks/{_id(task_id)}/history", api.HistoryView, None, page_size)

    async def _act(
        self, task_id: str, action: str, body: Mapping[str, Any], key: str | None, retry: Retry
    ) -> api.TaskView:
        answer = await self.transport.call(
            "POST", f"/api/tasks/{_id(task_id)}/{action}", body=body, idempotency_key=key, retry=retry
        )
        return self.transport.decode(answer, api.TaskView)

    async def cancel(
        self, task_id: str, reason: str | None = None, *, expected_revision: int | None = None
    ) -> api.TaskView:
        """Cancel the task and its active descendants. A repeat is harmless (a canceled task answers
        unchanged), so it is retried like a read; with ``expected_revision`` only when nothing was sent."""
        retry: Retry = "safe" if expected_revision is None else "connect"
        return await self._act(
            task_id, "cancel", _given(reason=reason, expectedRevision=expected_revision), None, retry
        )

    async def approve(
        self, task_id: str, *, expected_revision: int | None = None, idempotency_key: str | None = None
    ) -> api.TaskView:
        return await self._act(
            task_id, "approve", _given(expectedRevision=expected_revision), idempotency_key, _keyed(idempotency_key)
        )

    async def amend(
        self,
        task_id: str,
        payload: Any,
        *,
        expected_revision: int | None = None,
        idempotency_key: str | None = None,
    ) -> api.TaskView:
        body = _given(payload=raw(payload), expectedRevision=expected_revision)
        return await self._act(task_id, "amend", body, idempotency_key, _keyed(idempotency_key))

    async def retry(
        self, task_id: str, *, expected_revision: int | None = None, idempotency_key: str | None = None
    ) -> api.TaskView:
        return await self._act(
            task_id, "retry", _given(expectedRevision=expected_revision), idempotency_key, _keyed(idempotency_key)
        )

    async def rework(
        self,
        task_id: str,
        reason: str,
        payload: Any = _NOT_SENT,
        *,
        expected_revision: int | None = None,
        idempotency_key: str | None = None,
    ) -> api.TaskView:
        """Requeue a succeeded or failed task, with a new ``payload`` when one is given."""
        body = _given(reason=reason, payload=raw(payload), expectedRevision=expected_revision)
        return await self._act(task_id, "rework", body, idempotency_key, _keyed(idempotency_key))

    async def wait(
        self,
        task_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 -- the call's own deadline, as documented
        *,
        states: Iterable[str] = TERMINAL_STATES,
    ) -> api.TaskView:
        """The task once it is in one of ``states`` (default: terminal). Subscribes to the task's events
        first, then reads the task, so no change is missed; a lost stream resumes with ``Last-Event-ID``.
        Raises ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
        return await wait_for(self.transport, task_id, timeout, frozenset(states))

    # -- events ----------------------------------------------------------------------------------------
    def events(
        self,
        *,
        types: Iterable[str] | None = None,
        aggregate_id: str | None = None,
        last_event_id: int | None = None,
    ) -> EventStream:
        """The event stream (``GET /api/events``) as an async iterator of ``Event`` (``wire.messages``) and
        ``Gap``. From ``last_event_id`` + 1 when given, else from the next new event; after a lost
        connection or an ``event: disconnect`` it reconnects with ``Last-Event-ID`` by itself. Use it as
        ``async with client.events(...) as stream: async for ev in stream`` to close it when done."""
        return EventStream(self.transport, types=types, aggregate_id=aggregate_id, last_event_id=last_event_id)
