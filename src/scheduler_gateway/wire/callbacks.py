"""Result callbacks on the wire (docs/API.md, Callbacks): the body the gateway POSTs, its headers and its signature.

A receiver checks ``X-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>`` over the
exact bytes it received, and deduplicates on ``X-Callback-Id: <taskId>:<revision>`` (delivery is at least
once). This module only formats and checks: the clock and the secret are the caller's.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgspec

from .artifacts import ArtifactInfo
from .messages import NULL

CALLBACK_ID_HEADER = "X-Callback-Id"
SIGNATURE_HEADER = "X-Signature"


class CallbackError(msgspec.Struct, frozen=True):
    code: str
    message: str = ""


class CallbackBody(msgspec.Struct, rename="camel", frozen=True, kw_only=True, omit_defaults=False):
    """``{"taskId", "runId", "state", "revision", "result", "error", "finishedAt"}``."""

    task_id: str
    run_id: str
    state: str
    revision: int
    result: msgspec.Raw = NULL
    error: CallbackError | None = None
    finished_at: str | None = None
    #: the task's artifacts when it reached this state (CONTRACT 2.11), oldest first
    artifacts: list[ArtifactInfo] = []


def callback_id(task_id: str, revision: int) -> str:
    """The receiver's dedup key: a task retried or reworked later reaches a new terminal revision."""
    return f"{task_id}:{revision}"


def signature(secret: str, t: int, body: bytes) -> str:
    """The ``X-Signature`` value for ``body`` sent at unix second ``t``."""
    mac = hmac.new(secret.encode(), str(t).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(secret: str, header: str, body: bytes, now: float, tolerance_s: float = 300.0) -> bool:
    """What a receiver does: the ``v1`` MAC matches and ``t`` is within ``tolerance_s`` of ``now``."""
    fields: dict[str, Any] = {}
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        fields.setdefault(key, value)
    try:
        t = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - t) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, t, body), f"t={t},v1={fields.get('v1', '')}")
