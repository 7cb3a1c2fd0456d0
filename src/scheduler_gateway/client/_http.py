"""The request core of ``GatewayClient``: ``send`` (one request and its retries, docs/CLIENT.md, Retries) and
its helpers: a wire body as the JSON it stands for (only what was set), query parameters, a path segment, an
answer, and what a retry may do."""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec

from scheduler_gateway import tracing

from ._errors import CONNECTION_FAILED, error_for, error_from_response
from ._types import timestamp

if TYPE_CHECKING:
    from ._client import GatewayClient

T = TypeVar("T")
Body = msgspec.Struct | Mapping[str, Any]

USER_AGENT: Final = "scheduler-gateway-client/0.1"
_LARGE_BODY: Final = 512 * 1024

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


def _given(**fields: Any) -> dict[str, Any]:
    """An action's body: the fields given (``None`` and an empty ``Raw`` are left out)."""
    return {k: v for k, v in fields.items() if v is not None and not (isinstance(v, msgspec.Raw) and len(v) == 0)}


def _new_key() -> str:
    """A fresh Idempotency-Key: a UUID of version 7 (RFC 9562), 48 bits of Unix milliseconds then 74 random
    bits. Keys made later sort later, so the gateway's index of keys takes a client's keys at its end instead of
    at a random page each (a random uuid4 cost SQLite ~10 us more per create, docs/PERFORMANCE.md)."""
    r = int.from_bytes(os.urandom(10), "big")
    ms = time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF
    h = f"{ms:012x}7{r >> 68:03x}{(0b10 << 62) | (r & 0x3FFF_FFFF_FFFF_FFFF):016x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _keyed(key: str | None) -> Retry:
    return "safe" if key is not None else "connect"


def _trace_headers() -> dict[str, str]:
    """``traceparent`` of the caller's active span when the application runs OpenTelemetry, else nothing."""
    traceparent = tracing.current_traceparent()
    return {} if traceparent is None else {"traceparent": traceparent}


async def send(
    client: GatewayClient,
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
    headers = _trace_headers()
    data: bytes | None = None
    if body is not None:
        data = msgspec.json.encode(_jsonable(body))
        headers["Content-Type"] = "application/json"
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    url = client.base_url + path
    query = _query(params or {})
    accept = set(ok)
    attempt = 0
    while True:
        try:
            # a large body goes as a file-like object, so aiohttp writes it without blocking the loop
            payload: Any = io.BytesIO(data) if data is not None and len(data) > _LARGE_BODY else data
            async with client._http().request(
                method, url, data=payload, params=query, headers=headers, timeout=client.timeout
            ) as resp:
                answer = _Answer(resp.status, await resp.read(), dict(resp.headers))
        except aiohttp.ClientConnectorError as exc:  # never connected: nothing was sent
            failure = error_for(CONNECTION_FAILED, f"cannot connect to {client.base_url}: {exc}")
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
        if attempt >= client.retries:
            raise failure
        await asyncio.sleep(client._delay(attempt))
        attempt += 1
