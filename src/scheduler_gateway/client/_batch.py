"""``GatewayClient.submit_many``: many creates through ``POST /api/tasks/batch``, in chunks bounded by count
and bytes. Every item's Idempotency-Key is settled before anything is sent (the caller's, else a fresh one), so a
chunk can be retried whole, and a call that stops part way raises ``SubmitManyError`` with every item's
outcome and key: sending its ``items`` again replays what was made and creates only what is missing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, Final, cast

import msgspec

from scheduler_gateway.wire import api

from ._errors import GatewayClientError, error_for
from ._http import _jsonable, _new_key
from ._transport import Transport
from ._types import SubmitOutcome, SubmitResult, _BatchItemView, _BatchView

MAX_BATCH: Final = 1000  # items per POST /api/tasks/batch
MAX_BATCH_BYTES: Final = 48 * 1024 * 1024  # a chunk's body stays well under the route's 64 MiB
BATCH_PATH: Final = "/api/tasks/batch"

Item = api.CreateTaskBody | Mapping[str, Any]
KEY_FIELD: Final = "idempotencyKey"


class SubmitManyError(GatewayClientError):
    """``submit_many`` stopped part way: one of its requests failed as a whole (no answer after the retries,
    401, 413, a 5xx...). The exception is also of that failure's own class (``Unauthenticated``,
    ``Unavailable``...) with its ``code``, ``status``, ``message``; ``error`` is that failure itself.

    ``results`` holds one ``SubmitResult`` per item, in order, each with its ``idempotency_key`` and
    ``outcome``: what earlier requests made (``created``, ``replayed``) or refused alone (``refused``), then
    the failed request's items (``not_created``, or ``unknown`` when it got no usable answer and may have
    been made) and the rest (``unsent``). ``items`` are the tasks as given, each carrying its key: send them
    again (``submit_many(e.items)``) and the items made come back as replays, only the missing ones are
    created, and the answer is one result per item in the same order."""

    def __init__(self, error: GatewayClientError, results: list[SubmitResult], tasks: Sequence[Item]) -> None:
        super().__init__(
            error.code, error.message, request_id=error.request_id, details=error.details, status=error.status
        )
        self.error = error
        self.results = results
        self._tasks = tasks

    @property
    def keys(self) -> list[str]:
        """Every item's idempotency key, in order (``submit_many(tasks, idempotency_keys=e.keys)`` retries)."""
        return [r.idempotency_key for r in self.results]

    @property
    def committed(self) -> list[SubmitResult]:
        """The items that have their task (``created`` or ``replayed``)."""
        return [r for r in self.results if r.task is not None]

    @property
    def pending(self) -> list[SubmitResult]:
        """The items a resend may still create: ``not_created``, ``unknown``, ``unsent``."""
        return [r for r in self.results if r.outcome in ("not_created", "unknown", "unsent")]

    @cached_property
    def items(self) -> list[api.BatchItemBody | dict[str, Any]]:
        """Every task as given, with its key in it: a ``BatchItemBody`` for a wire body, a dict (a copy,
        with ``"idempotencyKey"``) for a dict."""
        return [_with_key(t, r.idempotency_key) for t, r in zip(self._tasks, self.results, strict=True)]

    def __str__(self) -> str:
        counts: dict[SubmitOutcome, int] = {}
        for r in self.results:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        told = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
        return f"{self.code}: {self.message} (submit_many of {len(self.results)} items: {told})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r}, "
            f"committed={len(self.committed)}, pending={len(self.pending)})"
        )


_ERROR_CLASSES: dict[type[GatewayClientError], type[SubmitManyError]] = {GatewayClientError: SubmitManyError}


def _error_class(family: type[GatewayClientError]) -> type[SubmitManyError]:
    """``SubmitManyError`` that is also of the failure's own class, so ``except Unauthenticated`` still
    catches a refused batch as it did before the exception carried the results (one class per family)."""
    if issubclass(family, SubmitManyError):
        return SubmitManyError
    cls = _ERROR_CLASSES.get(family)
    if cls is None:
        name = f"SubmitManyError[{family.__name__}]"
        made = type(name, (SubmitManyError, family), {"__module__": __name__, "__qualname__": name})
        cls = _ERROR_CLASSES[family] = cast("type[SubmitManyError]", made)
    return cls


def _own_key(t: Item) -> str | None:
    if isinstance(t, api.BatchItemBody):
        return t.idempotency_key or None
    if isinstance(t, Mapping):
        key = t.get(KEY_FIELD)
        if key is not None and not isinstance(key, str):
            raise ValueError(f"{KEY_FIELD} must be a string")
        return key or None
    return None


def _with_key(t: Item, key: str) -> api.BatchItemBody | dict[str, Any]:
    if isinstance(t, api.BatchItemBody):
        return msgspec.structs.replace(t, idempotency_key=key)
    if isinstance(t, api.CreateTaskBody):
        fields = {f: getattr(t, f) for f in api.CreateTaskBody.__struct_fields__}
        return api.BatchItemBody(**fields, idempotency_key=key)
    return {**t, KEY_FIELD: key}


def _keys(tasks: Sequence[Item], idempotency_keys: Sequence[str] | None) -> list[str]:
    """One key per task, settled before anything is sent: given, carried by the item, else a fresh one."""
    if idempotency_keys is None:
        return [_own_key(t) or _new_key() for t in tasks]
    if len(idempotency_keys) != len(tasks):
        raise ValueError("idempotency_keys must have one key per task")
    for i, (t, key) in enumerate(zip(tasks, idempotency_keys, strict=True)):
        own = _own_key(t)
        if own is not None and own != key:
            raise ValueError(f"task {i} carries the key {own!r}, idempotency_keys gives {key!r}")
    return list(idempotency_keys)


def _item_result(index: int, key: str, it: _BatchItemView, request_id: str | None) -> SubmitResult:
    if it.task is not None and it.error is None:
        return SubmitResult(index, key, it.status, it.task, it.replayed, None, "replayed" if it.replayed else "created")
    if it.error is not None:
        error = error_for(
            it.error.code, it.error.message, status=it.status, details=it.error.details, request_id=request_id
        )
    else:
        error = error_for("INTERNAL", "the batch answered an item without a task or an error", status=it.status)
    return SubmitResult(index, key, it.status, None, False, error, "refused")


async def submit_batches(
    transport: Transport,
    tasks: Sequence[Item],
    idempotency_keys: Sequence[str] | None,
    chunk_size: int,
) -> list[SubmitResult]:
    if not 1 <= chunk_size <= MAX_BATCH:
        raise ValueError(f"chunk_size must be 1 to {MAX_BATCH}")
    keys = _keys(tasks, idempotency_keys)
    items: list[bytes] = []
    for t, key in zip(tasks, keys, strict=True):
        item = _jsonable(t)
        item[KEY_FIELD] = key
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
        try:
            answer = await transport.call("POST", BATCH_PATH, body=body)
        except GatewayClientError as exc:  # the transport lets no other error out
            # an answered refusal (4xx) made nothing; no answer, or a 5xx, may have made some of the chunk
            made_nothing = exc.status is not None and 400 <= exc.status < 500
            raise _stopped(exc, "not_created" if made_nothing else "unknown", results, start, end, tasks, keys) from exc
        request_id = answer.headers.get("X-Request-Id")
        try:
            view = transport.decode(answer, _BatchView)
        except GatewayClientError as exc:  # HTTP_ERROR: the answer cannot be read
            raise _stopped(exc, "unknown", results, start, end, tasks, keys) from exc
        if len(view.items) != end - start:
            failure = error_for(
                "INTERNAL",
                f"the batch answered {len(view.items)} items for {end - start}",
                status=answer.status,
                request_id=request_id,
            )
            raise _stopped(failure, "unknown", results, start, end, tasks, keys)
        for i, it in enumerate(view.items, start):
            results.append(_item_result(i, keys[i], it, request_id))
        start = end
    return results


def _stopped(
    failure: GatewayClientError,
    outcome: SubmitOutcome,
    results: list[SubmitResult],
    start: int,
    end: int,
    tasks: Sequence[Item],
    keys: list[str],
) -> SubmitManyError:
    """The exception of a call stopped at the chunk ``start:end``: every item's outcome and key."""
    done = list(results)
    done += [SubmitResult(i, keys[i], None, None, False, failure, outcome) for i in range(start, end)]
    done += [SubmitResult(i, keys[i], None, None, False, failure, "unsent") for i in range(end, len(keys))]
    return _error_class(type(failure))(failure, done, tasks)
