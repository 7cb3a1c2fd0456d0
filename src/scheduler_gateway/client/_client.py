"""``GatewayClient``: the admin API (docs/API.md) from asyncio, over one keep-alive aiohttp session.

Bodies are the wire types (``scheduler_gateway.wire.api`` and ``wire.schedule_api``); answers are decoded
into the wire views (``TaskView``, ``ScheduledTaskView``...). Refusals raise ``GatewayClientError``
subclasses carrying the stable code. Creates carry an ``Idempotency-Key`` (the caller's, else a fresh
uuid4) and are retried with the same key on a lost connection or a 503; other writes are retried only
when that cannot do a change twice (see ``docs/CLIENT.md``, Retries).
"""

from __future__ import annotations

import asyncio
import io
import random
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Literal, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec

from scheduler_gateway.wire import api
from scheduler_gateway.wire import schedule_api as sa
from scheduler_gateway.wire.messages import Event

from . import _sse
from ._errors import CONNECTION_FAILED, GatewayClientError, Unavailable, error_for, error_from_response
from ._types import (
    TERMINAL_STATES,
    CallbackDeadLetterView,
    Disconnect,
    Gap,
    ReadyView,
    SubmitResult,
    _BatchView,
    raw,
    timestamp,
)

T = TypeVar("T")
Body = msgspec.Struct | Mapping[str, Any]

USER_AGENT: Final = "scheduler-gateway-client/0.1"
MAX_BATCH: Final = 1000  # items per POST /api/tasks/batch
MAX_BATCH_BYTES: Final = 48 * 1024 * 1024  # a chunk's body stays well under the route's 64 MiB
_LARGE_BODY: Final = 512 * 1024
_NOT_SENT: Any = msgspec.Raw(b"")  # "no payload" in rework (a payload of null is raw(None))

# what a retry may do: "safe" requests are retried on any lost answer and on a 503; "connect" ones only
# when the connection was never made (the request cannot have reached the gateway)
Retry = Literal["safe", "connect"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, msgspec.Raw) or isinstance(b, msgspec.Raw):
        return isinstance(a, msgspec.Raw) and isinstance(b, msgspec.Raw) and bytes(a) == bytes(b)
    return type(a) is type(b) and bool(a == b)


def _jsonable(value: Any) -> Any:
    """A wire Struct as the JSON object it stands for, leaving out what was not set (``None``, an empty
    ``Raw``, a field at its default): a PATCH or an action carries only the fields the caller gave, and a
    create is the smallest body that says it, so the same request sent by other means (curl, another
    client) with the same Idempotency-Key is a replay, not a conflict."""
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        for f in msgspec.structs.fields(value):
            v = getattr(value, f.name)
            if v is None or (isinstance(v, msgspec.Raw) and len(v) == 0):
                continue
            if f.default is not msgspec.NODEFAULT and _same(v, f.default):
                continue
            if f.default_factory is not msgspec.NODEFAULT and _same(v, f.default_factory()):
                continue
            out[f.encode_name] = _jsonable(v)
        return out
    if isinstance(value, Mapping):  # a caller's dict: only an empty Raw means "not sent" (None is null)
        return {k: _jsonable(v) for k, v in value.items() if not (isinstance(v, msgspec.Raw) and len(v) == 0)}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _query(params: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, datetime):
            out[k] = timestamp(v) or ""
        elif isinstance(v, list | tuple | set | frozenset):
            out[k] = ",".join(sorted(v) if isinstance(v, set | frozenset) else v)
        else:
            out[k] = str(v)
    return out


def _id(value: str) -> str:
    return quote(value, safe="")


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def replayed(self) -> bool:
        return self.headers.get("Idempotent-Replayed", "").lower() == "true"


class _Stop(Exception):
    def __init__(self, task: api.TaskView) -> None:
        self.task = task


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
        headers: dict[str, str] = {}
        data: bytes | None = None
        if body is not None:
            data = msgspec.json.encode(_jsonable(body))
            headers["Content-Type"] = "application/json"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        url = self.base_url + path
        query = _query(params or {})
        accept = set(ok)
        attempt = 0
        while True:
            try:
                # a large body goes as a file-like object, so aiohttp writes it without blocking the loop
                payload: Any = io.BytesIO(data) if data is not None and len(data) > _LARGE_BODY else data
                async with self._http().request(
                    method, url, data=payload, params=query, headers=headers, timeout=self.timeout
                ) as resp:
                    answer = _Answer(resp.status, await resp.read(), dict(resp.headers))
            except aiohttp.ClientConnectorError as exc:  # never connected: nothing was sent
                failure = error_for(CONNECTION_FAILED, f"cannot connect to {self.base_url}: {exc}")
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                failure = error_for(CONNECTION_FAILED, f"{method} {path}: no answer ({type(exc).__name__}: {exc})")
                if retry != "safe":
                    raise failure from exc
            else:
                if answer.status < 400 or answer.status in accept:
                    return answer
                if answer.status == 404 and missing_ok_on_retry and attempt > 0:
                    return _Answer(204, b"", answer.headers)  # the lost first try did it
                failure = error_from_response(answer.status, answer.body, answer.headers.get("X-Request-Id"))
                if answer.status != 503 or retry != "safe":
                    raise failure
            if attempt >= self.retries:
                raise failure
            await asyncio.sleep(self._delay(attempt))
            attempt += 1

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
    ) -> api.CreateTaskBody:
        """A ``CreateTaskBody`` from Python values (``payload`` is encoded to JSON)."""
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
        ``submit(CreateTaskBody(...))``. Sent with ``idempotency_key`` or a fresh uuid4, and retried with
        that same key after a lost answer or a 503, so it never creates two tasks."""
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
        Every item carries its own ``idempotencyKey`` (given, else a fresh uuid4), so a chunk is retried
        whole after a lost answer or a 503 without creating anything twice. One result per item, in order:
        its task, or its error; a chunk refused as a whole raises."""
        if not 1 <= chunk_size <= MAX_BATCH:
            raise ValueError(f"chunk_size must be 1 to {MAX_BATCH}")
        if idempotency_keys is not None and len(idempotency_keys) != len(tasks):
            raise ValueError("idempotency_keys must have one key per task")
        keys = list(idempotency_keys) if idempotency_keys is not None else [_new_key() for _ in tasks]
        items: list[bytes] = []
        for t, key in zip(tasks, keys, strict=True):
            item = _jsonable(t)
            item["idempotencyKey"] = key
            items.append(msgspec.json.encode(item))
        results: list[SubmitResult] = []
        start = 0
        while start < len(items):
            end, size = start, 0
            while (
                end < len(items)
                and end - start < chunk_size
                and (end == start or size + len(items[end]) < MAX_BATCH_BYTES)
            ):
                size += len(items[end]) + 1
                end += 1
            body = msgspec.Raw(b'{"tasks":[' + b",".join(items[start:end]) + b"]}")
            answer = await self._call("POST", "/api/tasks/batch", body=body)
            view = self._decode(answer.body, _BatchView)
            if len(view.items) != end - start:
                raise error_for("INTERNAL", f"the batch answered {len(view.items)} items for {end - start}")
            for i, it in enumerate(view.items, start):
                error = None
                if it.error is not None:
                    error = error_for(
                        it.error.code,
                        it.error.message,
                        status=it.status,
                        details=it.error.details,
                        request_id=answer.headers.get("X-Request-Id"),
                    )
                results.append(SubmitResult(i, keys[i], it.status, it.task, it.replayed, error))
            start = end
        return results

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
        wanted = frozenset(states)

        async def check() -> None:
            task = await self.get(task_id)
            if task.state in wanted:
                raise _Stop(task)

        async with asyncio.timeout(timeout):
            stream = EventStream(self, aggregate_id=task_id, on_connect=check)
            try:
                async for ev in stream:
                    if isinstance(ev, Gap) or (isinstance(ev.data, dict) and ev.data.get("to") in wanted):
                        await check()
            except _Stop as stop:
                return stop.task
            finally:
                await stream.aclose()
        raise AssertionError("unreachable: the event stream does not end")  # pragma: no cover

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


def _given(**fields: Any) -> dict[str, Any]:
    """An action's body: the fields given (``None`` and an empty ``Raw`` are left out)."""
    return {k: v for k, v in fields.items() if v is not None and not (isinstance(v, msgspec.Raw) and len(v) == 0)}


def _new_key() -> str:
    return str(uuid.uuid4())


def _keyed(key: str | None) -> Retry:
    return "safe" if key is not None else "connect"


class EventStream:
    """``GatewayClient.events()``: an async iterator of ``Event`` and ``Gap`` that reconnects by itself.

    The first connection is made by ``open()`` (or entering ``async with``), else by the first ``anext``:
    the gateway subscribes the stream before it answers, so every event after ``open()`` returns is seen.
    ``last_event_id`` is the seq of the last event yielded (what a reconnect resumes after);
    ``disconnects`` counts the connections that ended, ``last_disconnect`` the last ``event: disconnect``."""

    def __init__(
        self,
        client: GatewayClient,
        *,
        types: Iterable[str] | None = None,
        aggregate_id: str | None = None,
        last_event_id: int | None = None,
        on_connect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        self.types = sorted(set(types)) if types is not None else None
        self.aggregate_id = aggregate_id
        self.last_event_id = last_event_id
        self.disconnects = 0
        self.last_disconnect: Disconnect | None = None
        self._on_connect = on_connect
        self._pending: aiohttp.ClientResponse | None = None
        self._gen: AsyncGenerator[Event | Gap, None] | None = None
        self._closed = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event | Gap:
        if self._closed:
            raise StopAsyncIteration
        if self._gen is None:
            self._gen = self._run()
        return await self._gen.__anext__()

    async def open(self) -> EventStream:
        """Connect now (retrying a lost connection or a 503; a refusal such as 401 raises)."""
        if self._gen is None and self._pending is None and not self._closed:
            self._pending = await self._connect()
        return self

    async def aclose(self) -> None:
        """Close the connection (an iteration that was not run to its end should be closed)."""
        self._closed = True
        gen, self._gen = self._gen, None
        if gen is not None:
            await gen.aclose()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.close()

    async def __aenter__(self) -> EventStream:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _open(self) -> aiohttp.ClientResponse:
        c = self.client
        params = _query({"types": self.types, "aggregateId": self.aggregate_id})
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = str(self.last_event_id)
        resp = await c._http().get(c.base_url + "/api/events", params=params, headers=headers, timeout=c.stream_timeout)
        if resp.status != 200:
            body = await resp.read()
            resp.release()
            raise error_from_response(resp.status, body, resp.headers.get("X-Request-Id"))
        return resp

    async def _connect(self) -> aiohttp.ClientResponse:
        failures = 0
        while True:
            try:
                return await self._open()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError, Unavailable):
                await asyncio.sleep(self.client._delay(min(failures, 8)))
                failures += 1

    async def _run(self) -> AsyncGenerator[Event | Gap, None]:
        decode_event = msgspec.json.Decoder(Event).decode
        while True:
            resp, self._pending = self._pending or await self._connect(), None
            cut = False
            try:
                if self._on_connect is not None:
                    await self._on_connect()
                async for frame in _sse.frames(resp.content.iter_any()):
                    if frame.event == "gap":
                        yield msgspec.json.decode(frame.data, type=Gap)
                    elif frame.event == "disconnect":
                        self.last_disconnect = msgspec.json.decode(frame.data, type=Disconnect)
                        break
                    elif frame.data:
                        ev = decode_event(frame.data)
                        if ev.seq is None and frame.id is not None:
                            ev.seq = int(frame.id)
                        if ev.seq is not None:
                            self.last_event_id = ev.seq
                        yield ev
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError):
                cut = True
            finally:
                resp.close()
            self.disconnects += 1
            await asyncio.sleep(self.client._delay(1 if cut else 0))


__all__ = ["Body", "EventStream", "GatewayClient", "GatewayClientError"]
