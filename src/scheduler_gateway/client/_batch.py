"""``GatewayClient.submit_many``: many creates through ``POST /api/tasks/batch``, in chunks bounded by count
and bytes, every item with its own Idempotency-Key so a chunk can be retried whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from scheduler_gateway.wire import api

from ._errors import error_for
from ._http import _jsonable, _new_key
from ._types import SubmitResult, _BatchView

if TYPE_CHECKING:
    from ._client import GatewayClient

MAX_BATCH: Final = 1000  # items per POST /api/tasks/batch
MAX_BATCH_BYTES: Final = 48 * 1024 * 1024  # a chunk's body stays well under the route's 64 MiB


async def submit_batches(
    client: GatewayClient,
    tasks: Sequence[api.CreateTaskBody | Mapping[str, Any]],
    idempotency_keys: Sequence[str] | None,
    chunk_size: int,
) -> list[SubmitResult]:
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
            end < len(items) and end - start < chunk_size and (end == start or size + len(items[end]) < MAX_BATCH_BYTES)
        ):
            size += len(items[end]) + 1
            end += 1
        body = msgspec.Raw(b'{"tasks":[' + b",".join(items[start:end]) + b"]}")
        answer = await client._call("POST", "/api/tasks/batch", body=body)
        view = client._decode(answer.body, _BatchView)
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
