"""``GatewayClient``: the admin API (docs/API.md) from asyncio, over one keep-alive aiohttp session.

Bodies are the wire types (``scheduler_gateway.wire.api`` and ``wire.schedule_api``); answers are decoded
into the wire views (``TaskView``, ``ScheduledTaskView``...). Refusals raise ``GatewayClientError``
subclasses carrying the stable code. Creates carry an ``Idempotency-Key`` (the caller's, else a fresh UUID of
version 7) and are retried with the same key on a lost connection or a 503; other writes are retried only
when that cannot do a change twice (see ``docs/CLIENT.md``, Retries).

The request helpers and the retry loop live in ``_http``, the batch create in ``_batch``, the event stream
and ``wait`` in ``_events``; this module re-exports the names it used to define.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import aiohttp
import msgspec

from scheduler_gateway.wire import api
from scheduler_gateway.wire import schedule_api as sa
from scheduler_gateway.wire.kind_api import KindList

from ._artifacts import CHUNK_BYTES, ArtifactStream, Destination, download
from ._batch import MAX_BATCH, MAX_BATCH_BYTES, submit_batches
from ._errors import GatewayClientError
from ._events import EventStream, wait_for
from ._http import USER_AGENT, Body, Retry, T, _Answer, _given, _id, _keyed, _new_key, send
from ._types import (
    TERMINAL_STATES,
    ArtifactView,
    CallbackDeadLetterView,
    KindView,
    RateView,
    ReadyView,
    SubmitResult,
    raw,
    timestamp,
)

#: kinds asked per page of ``GET /api/kinds`` (the API's largest page)
KINDS_PAGE = 500
_NOT_SENT: Any = msgspec.Raw(b"")  # "no payload" in rework (a payload of null is raw(None))
_UNCHANGED: Any = object()  # a kind's setting left as it is (None removes the limit)


class GatewayClient:
    """The admin API over one keep-alive session. Use it as ``async with GatewayClient(url, token) as gw``
    (or call ``close()``); one client serves many concurrent calls."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        event_read_timeout_s: float = 45.0,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        # a live stream is quiet between events but for the gateway's ``: ping`` every 15 s
        self.stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=event_read_timeout_s)
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session = session
        self._own_session = session is None
        self._decoders: dict[Any, msgspec.json.Decoder[Any]] = {}

    # -- lifecycle -------------------------------------------------------------------------------------
    async def __aenter__(self) -> GatewayClient:
        self._http()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session (when the client made it)."""
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
            self._own_session = True
        return self._session

    # -- the request core ------------------------------------------------------------------------------
    def _decode(self, data: bytes, type_: type[T]) -> T:
        dec = self._decoders.get(type_)
        if dec is None:
            dec = self._decoders[type_] = msgspec.json.Decoder(type_)
        result: T = dec.decode(data)
        return result

    def _delay(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * float(2**attempt)) * random.uniform(0.5, 1.0)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        retry: Retry = "safe",
        ok: Iterable[int] = (),
        missing_ok_on_retry: bool = False,
    ) -> _Answer:
        """One request with its retries (``_http.send``): the answer, or the refusal raised."""
        return await send(
            self,
            method,
            path,
            body=body,
            params=params,
            idempotency_key=idempotency_key,
            retry=retry,
            ok=ok,
            missing_ok_on_retry=missing_ok_on_retry,
        )

    async def _get(self, path: str, type_: type[T], params: Mapping[str, Any] | None = None) -> T:
        return self._decode((await self._call("GET", path, params=params)).body, type_)

    async def _pages(
        self, path: str, type_: type[T], params: Mapping[str, Any] | None = None, page_size: int = 100
    ) -> AsyncIterator[T]:
        """Every item of a list route, page after page (``nextCursor``), oldest first."""
        cursor: str | None = None
        while True:
            page = await self._get(path, api.Page[type_], {**(params or {}), "limit": page_size, "cursor": cursor})  # type: ignore[valid-type]
            for item in page.items:
                yield item
            cursor = page.next_cursor
            if not cursor:
                return

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
        answer = await self._call("POST", "/api/tasks", body=body, idempotency_key=idempotency_key or _new_key())
        return self._decode(answer.body, api.TaskView)

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
        return await submit_batches(self, tasks, idempotency_keys, chunk_size)

    async def get(self, task_id: str) -> api.TaskView:
        return await self._get(f"/api/tasks/{_id(task_id)}", api.TaskView)

    def list_tasks(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        parent_id: str | None = None,
        run_id: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[api.TaskView]:
        """Every task the caller sees, oldest first, fetched page by page as the iteration goes."""
        params = {"state": state, "kind": kind, "parentId": parent_id, "runId": run_id}
        return self._pages("/api/tasks", api.TaskView, params, page_size)

    def history(self, task_id: str, *, page_size: int = 100) -> AsyncIterator[api.HistoryView]:
        return self._pages(f"/api/tasks/{_id(task_id)}/history", api.HistoryView, None, page_size)

    async def _act(
        self, task_id: str, action: str, body: Mapping[str, Any], key: str | None, retry: Retry
    ) -> api.TaskView:
        answer = await self._call(
            "POST", f"/api/tasks/{_id(task_id)}/{action}", body=body, idempotency_key=key, retry=retry
        )
        return self._decode(answer.body, api.TaskView)

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
        return await wait_for(self, task_id, timeout, frozenset(states))

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
        return EventStream(self, types=types, aggregate_id=aggregate_id, last_event_id=last_event_id)

    # -- dead letters, audit, nodes --------------------------------------------------------------------
    def dead_letters(
        self,
        *,
        archived: bool | None = None,
        dead_reason: str | None = None,
        retry_count: int | None = None,
        original_task_id: str | None = None,
        exhausted: bool | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[api.DeadLetterView]:
        params = {
            "archived": archived,
            "deadReason": dead_reason,
            "retryCount": retry_count,
            "originalTaskId": original_task_id,
            "exhausted": exhausted,
        }
        return self._pages("/api/deadletter", api.DeadLetterView, params, page_size)

    async def get_dead_letter(self, dead_letter_id: str) -> api.DeadLetterView:
        return await self._get(f"/api/deadletter/{_id(dead_letter_id)}", api.DeadLetterView)

    async def redrive(self, dead_letter_id: str, *, force: bool = False, reason: str | None = None) -> api.RedriveView:
        """``POST /api/deadletter/{id}/retry`` (``force``: ``/force-retry`` with ``reason``). Not retried
        after a lost answer: a redrive counts."""
        path = f"/api/deadletter/{_id(dead_letter_id)}/" + ("force-retry" if force else "retry")
        body = _given(reason=reason) if force else {}
        return self._decode((await self._call("POST", path, body=body, retry="connect")).body, api.RedriveView)

    def callback_dead_letters(
        self, *, task_id: str | None = None, page_size: int = 100
    ) -> AsyncIterator[CallbackDeadLetterView]:
        return self._pages("/api/callbacks/deadletter", CallbackDeadLetterView, {"taskId": task_id}, page_size)

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetterView:
        return await self._get(f"/api/callbacks/deadletter/{_id(letter_id)}", CallbackDeadLetterView)

    async def redeliver(self, letter_id: str) -> CallbackDeadLetterView:
        path = f"/api/callbacks/deadletter/{_id(letter_id)}/redeliver"
        return self._decode((await self._call("POST", path, retry="connect")).body, CallbackDeadLetterView)

    def audit(
        self,
        *,
        object_id: str | None = None,
        action: str | None = None,
        request_id: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[api.AuditView]:
        params = {"objectId": object_id, "action": action, "requestId": request_id}
        return self._pages("/api/audit", api.AuditView, params, page_size)

    async def nodes(self) -> list[api.NodeView]:
        return [n async for n in self._pages("/api/nodes", api.NodeView)]

    async def drain(self, node_id: str, *, undrain: bool = False) -> api.NodeView:
        """Drain a node (admin), or undrain it; both are repeats by nature."""
        path = f"/api/nodes/{_id(node_id)}/" + ("undrain" if undrain else "drain")
        return self._decode((await self._call("POST", path)).body, api.NodeView)

    async def health(self) -> bool:
        """``GET /healthz``: True when the gateway answers ok."""
        return (await self._call("GET", "/healthz")).status == 200

    async def ready(self) -> ReadyView:
        """``GET /readyz``: readiness and its checks (a 503 "not_ready" is an answer here, not an error)."""
        return self._decode((await self._call("GET", "/readyz", ok=(503,))).body, ReadyView)

    # -- kinds (flow control) --------------------------------------------------------------------------
    async def kinds(self) -> list[KindView]:
        """``GET /api/kinds``: every kind that has tasks or settings, with its limits and counts, by name (every
        page: ``nextCursor``; a gateway that predates paging answers one page without it)."""
        out: list[KindView] = []
        cursor: str | None = None
        while True:
            page = await self._get("/api/kinds", KindList, {"limit": KINDS_PAGE, "cursor": cursor})
            out += page.items
            cursor = page.next_cursor
            if not cursor:
                return out

    async def get_kind(self, kind: str) -> KindView:
        return await self._get(f"/api/kinds/{_id(kind)}", KindView)

    async def set_kind(
        self,
        kind: str,
        *,
        paused: bool = _UNCHANGED,
        concurrency: int | None = _UNCHANGED,
        key_concurrency: int | None = _UNCHANGED,
        rate: RateView | tuple[int, float] | None = _UNCHANGED,
        key_rate: RateView | tuple[int, float] | None = _UNCHANGED,
    ) -> KindView:
        """``PUT /api/kinds/{kind}`` (admin): only the settings given change; ``None`` removes that limit. A rate
        is a ``RateView`` or ``(limit, period_seconds)``. Setting the same values again is harmless: retried."""
        body: dict[str, Any] = {}
        for key, value in (
            ("paused", paused),
            ("concurrency", concurrency),
            ("keyConcurrency", key_concurrency),
            ("rate", rate),
            ("keyRate", key_rate),
        ):
            if value is _UNCHANGED:
                continue
            if isinstance(value, tuple):
                value = RateView(limit=value[0], period_seconds=value[1])
            body[key] = value
        answer = await self._call("PUT", f"/api/kinds/{_id(kind)}", body=body)
        return self._decode(answer.body, KindView)

    async def pause_kind(self, kind: str) -> KindView:
        """Start nothing more of ``kind`` (running tasks go on); a repeat is harmless."""
        return self._decode((await self._call("POST", f"/api/kinds/{_id(kind)}/pause")).body, KindView)

    async def resume_kind(self, kind: str) -> KindView:
        return self._decode((await self._call("POST", f"/api/kinds/{_id(kind)}/resume")).body, KindView)

    # -- artifacts -------------------------------------------------------------------------------------
    def artifacts(self, task_id: str, *, page_size: int = 100) -> AsyncIterator[ArtifactView]:
        """``GET /api/tasks/{id}/artifacts``: the task's artifacts, oldest first, page by page."""
        return self._pages(f"/api/tasks/{_id(task_id)}/artifacts", ArtifactView, None, page_size)

    async def list_artifacts(self, task_id: str) -> list[ArtifactView]:
        """The task's artifacts, oldest first, every page (a task has at most ``[artifacts] max_per_task``)."""
        return [a async for a in self.artifacts(task_id, page_size=500)]

    def open_artifact(
        self, task_id: str, name: str, *, start: int = 0, end: int | None = None, chunk_bytes: int = CHUNK_BYTES
    ) -> ArtifactStream:
        """The artifact's bytes as an async iterator of chunks (``start``..``end`` inclusive; None: to the end),
        resumed with ``Range`` after a cut connection. ``async with client.open_artifact(t, n) as s`` opens it
        (a refusal raises there) and tells ``s.size``, ``s.sha256``, ``s.content_type``; ``async for chunk in
        s`` reads it."""
        return ArtifactStream(self, task_id, name, start=start, end=end, chunk_bytes=chunk_bytes)

    async def download_artifact(
        self, task_id: str, name: str, to: Destination, *, chunk_bytes: int = CHUNK_BYTES, verify: bool = True
    ) -> int:
        """Stream the artifact to ``to``, a path or a binary file object (never held whole in memory); the
        number of bytes written. A path is written as ``<path>.part`` and renamed once all bytes arrived with
        the artifact's sha256 (``verify``; else ``DIGEST_MISMATCH``), so a refused or cut download leaves no
        file under the name. A refusal (``ARTIFACT_NOT_FOUND``, ``TASK_NOT_FOUND``...) raises before anything
        is written."""
        return await download(self, task_id, name, to, chunk_bytes=chunk_bytes, verify=verify)

    # -- threads ---------------------------------------------------------------------------------------
    async def create_thread(self, title: str | None = None) -> sa.ThreadView:
        """Not retried after a lost answer (the route takes no Idempotency-Key): that could make two."""
        answer = await self._call("POST", "/api/threads", body=sa.CreateThreadBody(title=title), retry="connect")
        return self._decode(answer.body, sa.ThreadView)

    async def get_thread(self, thread_id: str) -> sa.ThreadView:
        return await self._get(f"/api/threads/{_id(thread_id)}", sa.ThreadView)

    def list_threads(self, *, page_size: int = 100) -> AsyncIterator[sa.ThreadView]:
        return self._pages("/api/threads", sa.ThreadView, None, page_size)

    async def delete_thread(self, thread_id: str) -> None:
        await self._call("DELETE", f"/api/threads/{_id(thread_id)}", missing_ok_on_retry=True)

    def thread_schedules(self, thread_id: str, *, page_size: int = 100) -> AsyncIterator[sa.ScheduledTaskView]:
        return self._pages(f"/api/threads/{_id(thread_id)}/scheduled-tasks", sa.ScheduledTaskView, None, page_size)

    # -- scheduled tasks -------------------------------------------------------------------------------
    async def create_schedule(self, body: sa.CreateScheduledTaskBody | Mapping[str, Any]) -> sa.ScheduledTaskView:
        """Not retried after a lost answer (the route takes no Idempotency-Key): that could make two."""
        answer = await self._call("POST", "/api/scheduled-tasks", body=body, retry="connect")
        return self._decode(answer.body, sa.ScheduledTaskView)

    async def get_schedule(self, schedule_id: str) -> sa.ScheduledTaskView:
        return await self._get(f"/api/scheduled-tasks/{_id(schedule_id)}", sa.ScheduledTaskView)

    def list_schedules(self, *, status: str | None = None, page_size: int = 100) -> AsyncIterator[sa.ScheduledTaskView]:
        return self._pages("/api/scheduled-tasks", sa.ScheduledTaskView, {"status": status}, page_size)

    async def update_schedule(
        self, schedule_id: str, body: sa.UpdateScheduledTaskBody | Mapping[str, Any]
    ) -> sa.ScheduledTaskView:
        """PATCH: only the fields set in ``body`` change. Setting fields again is harmless, so it is retried."""
        answer = await self._call("PATCH", f"/api/scheduled-tasks/{_id(schedule_id)}", body=body)
        return self._decode(answer.body, sa.ScheduledTaskView)

    async def pause_schedule(self, schedule_id: str) -> sa.ScheduledTaskView:
        answer = await self._call("POST", f"/api/scheduled-tasks/{_id(schedule_id)}/pause")
        return self._decode(answer.body, sa.ScheduledTaskView)

    async def resume_schedule(self, schedule_id: str) -> sa.ScheduledTaskView:
        answer = await self._call("POST", f"/api/scheduled-tasks/{_id(schedule_id)}/resume")
        return self._decode(answer.body, sa.ScheduledTaskView)

    async def trigger_schedule(self, schedule_id: str) -> sa.RunView:
        """Start a run now. Not retried after a lost answer: that could start two."""
        answer = await self._call("POST", f"/api/scheduled-tasks/{_id(schedule_id)}/trigger", retry="connect")
        return self._decode(answer.body, sa.RunView)

    async def delete_schedule(self, schedule_id: str) -> None:
        await self._call("DELETE", f"/api/scheduled-tasks/{_id(schedule_id)}", missing_ok_on_retry=True)

    def schedule_runs(self, schedule_id: str, *, page_size: int = 100) -> AsyncIterator[sa.RunView]:
        return self._pages(f"/api/scheduled-tasks/{_id(schedule_id)}/runs", sa.RunView, None, page_size)

    async def upcoming(
        self, schedule_id: str, *, after: str | datetime | None = None, count: int | None = None
    ) -> list[str]:
        """The next fire times (RFC 3339 strings) after ``after`` (default now), ``count`` of them (1..100)."""
        view = await self._get(
            f"/api/scheduled-tasks/{_id(schedule_id)}/upcoming",
            sa.TimesView,
            {"after": timestamp(after), "count": count},
        )
        return view.items


__all__ = [
    "MAX_BATCH",
    "MAX_BATCH_BYTES",
    "USER_AGENT",
    "ArtifactStream",
    "Body",
    "EventStream",
    "GatewayClient",
    "GatewayClientError",
    "Retry",
]
