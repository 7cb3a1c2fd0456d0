"""``OperationCalls``: the operator's calls of ``GatewayClient`` (docs/CLIENT.md, Dead letters, audit, nodes,
and Artifacts) over the client's ``Transport``: dead letters and callback dead letters, the audit log, nodes,
health and readiness, kinds (flow control) and a task's artifacts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from scheduler_gateway.wire import api
from scheduler_gateway.wire.kind_api import KindList

from ._artifacts import CHUNK_BYTES, ArtifactStream, Destination, download
from ._http import _given, _id
from ._transport import Transport
from ._types import ArtifactView, CallbackDeadLetterView, KindView, RateView, ReadyView

#: kinds asked per page of ``GET /api/kinds`` (the API's largest page)
KINDS_PAGE = 500
_UNCHANGED: Any = object()  # a kind's setting left as it is (None removes the limit)


class OperationCalls:
    """Dead letters, audit, nodes, health, kinds and artifacts, over ``transport`` (a part of
    ``GatewayClient``)."""

    transport: Transport

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
        return self.transport.pages("/api/deadletter", api.DeadLetterView, params, page_size)

    async def get_dead_letter(self, dead_letter_id: str) -> api.DeadLetterView:
        return await self.transport.get(f"/api/deadletter/{_id(dead_letter_id)}", api.DeadLetterView)

    async def redrive(self, dead_letter_id: str, *, force: bool = False, reason: str | None = None) -> api.RedriveView:
        """``POST /api/deadletter/{id}/retry`` (``force``: ``/force-retry`` with ``reason``). Not retried
        after a lost answer: a redrive counts."""
        path = f"/api/deadletter/{_id(dead_letter_id)}/" + ("force-retry" if force else "retry")
        body = _given(reason=reason) if force else {}
        answer = await self.transport.call("POST", path, body=body, retry="connect")
        return self.transport.decode(answer, api.RedriveView)

    def callback_dead_letters(
        self, *, task_id: str | None = None, page_size: int = 100
    ) -> AsyncIterator[CallbackDeadLetterView]:
        return self.transport.pages("/api/callbacks/deadletter", CallbackDeadLetterView, {"taskId": task_id}, page_size)

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetterView:
        return await self.transport.get(f"/api/callbacks/deadletter/{_id(letter_id)}", CallbackDeadLetterView)

    async def redeliver(self, letter_id: str) -> CallbackDeadLetterView:
        path = f"/api/callbacks/deadletter/{_id(letter_id)}/redeliver"
        return self.transport.decode(await self.transport.call("POST", path, retry="connect"), CallbackDeadLetterView)

    def audit(
        self,
        *,
        object_id: str | None = None,
        action: str | None = None,
        request_id: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[api.AuditView]:
        params = {"objectId": object_id, "action": action, "requestId": request_id}
        return self.transport.pages("/api/audit", api.AuditView, params, page_size)

    async def nodes(self) -> list[api.NodeView]:
        return [n async for n in self.transport.pages("/api/nodes", api.NodeView)]

    async def drain(self, node_id: str, *, undrain: bool = False) -> api.NodeView:
        """Drain a node (admin), or undrain it; both are repeats by nature."""
        path = f"/api/nodes/{_id(node_id)}/" + ("undrain" if undrain else "drain")
        return self.transport.decode(await self.transport.call("POST", path), api.NodeView)

    async def health(self) -> bool:
        """``GET /healthz``: True when the gateway answers ok."""
        return (await self.transport.call("GET", "/healthz")).status == 200

    async def ready(self) -> ReadyView:
        """``GET /readyz``: readiness and its checks (a 503 "not_ready" is an answer here, not an error)."""
        return self.transport.decode(await self.transport.call("GET", "/readyz", ok=(503,)), ReadyView)

    # -- kinds (flow control) --------------------------------------------------------------------------
    async def kinds(self) -> list[KindView]:
        """``GET /api/kinds``: every kind that has tasks or settings, with its limits and counts, by name (every
        page: ``nextCursor``; a gateway that predates paging answers one page without it)."""
        out: list[KindView] = []
        cursor: str | None = None
        while True:
            page = await self.transport.get("/api/kinds", KindList, {"limit": KINDS_PAGE, "cursor": cursor})
            out += page.items
            cursor = page.next_cursor
            if not cursor:
                return out

    async def get_kind(self, kind: str) -> KindView:
        return await self.transport.get(f"/api/kinds/{_id(kind)}", KindView)

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
        answer = await self.transport.call("PUT", f"/api/kinds/{_id(kind)}", body=body)
        return self.transport.decode(answer, KindView)

    async def pause_kind(self, kind: str) -> KindView:
        """Start nothing more of ``kind`` (running tasks go on); a repeat is harmless."""
        return self.transport.decode(await self.transport.call("POST", f"/api/kinds/{_id(kind)}/pause"), KindView)

    async def resume_kind(self, kind: str) -> KindView:
        return self.transport.decode(await self.transport.call("POST", f"/api/kinds/{_id(kind)}/resume"), KindView)

    # -- artifacts -------------------------------------------------------------------------------------
    def artifacts(self, task_id: str, *, page_size: int = 100) -> AsyncIterator[ArtifactView]:
        """``GET /api/tasks/{id}/artifacts``: the task's artifacts, oldest first, page by page."""
        return self.transport.pages(f"/api/tasks/{_id(task_id)}/artifacts", ArtifactView, None, page_size)

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
        return ArtifactStream(self.transport, task_id, name, start=start, end=end, chunk_bytes=chunk_bytes)

    async def download_artifact(
        self, task_id: str, name: str, to: Destination, *, chunk_bytes: int = CHUNK_BYTES, verify: bool = True
    ) -> int:
        """Stream the artifact to ``to``, a path or a binary file object (never held whole in memory); the
        number of bytes written. A path is written as ``<path>.part`` and renamed once all bytes arrived with
        the artifact's sha256 (``verify``; else ``DIGEST_MISMATCH``), so a refused or cut download leaves no
        file under the name. A refusal (``ARTIFACT_NOT_FOUND``, ``TASK_NOT_FOUND``...) raises before anything
        is written."""
        return await download(self.transport, task_id, name, to, chunk_bytes=chunk_bytes, verify=verify)
