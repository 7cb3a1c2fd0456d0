"""What a request is made of, before the transport sends it: a wire body as the JSON it stands for (only what
was set), query parameters, a path segment, a fresh Idempotency-Key, the caller's ``traceparent``, what a
retry may do (``Retry``), and ``Answer``, a read answer. Pure functions: no I/O, no client."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, TypeVar
from urllib.parse import quote

import msgspec

from scheduler_gateway import tracing

from ._types import timestamp

T = TypeVar("T")
Body = msgspec.Struct | Mapping[str, Any]

USER_AGENT: Final = "scheduler-gateway-client/0.1"

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
class Answer:
    """An answer read whole: its status, body and headers."""

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
