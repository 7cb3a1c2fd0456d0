"""The one place that knows HTTP status codes: error code -> status, and the error envelope."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from scheduler_gateway.wire.api import ErrorBody, ErrorEnvelope
from scheduler_gateway.wire.errors import Code

STATUS_OF_CODE: dict[str, int] = {
    Code.INVALID_ARGUMENT: 400,
    Code.UNAUTHENTICATED: 401,
    Code.FORBIDDEN: 403,
    Code.TASK_NOT_FOUND: 404,
    Code.SCHEDULE_NOT_FOUND: 404,
    Code.THREAD_NOT_FOUND: 404,
    Code.DEAD_LETTER_NOT_FOUND: 404,
    Code.ARTIFACT_NOT_FOUND: 404,
    Code.WORKFLOW_NOT_FOUND: 404,
    Code.NOT_FOUND: 404,
    Code.INVALID_STATE_TRANSITION: 409,
    Code.TASK_ALREADY_TERMINAL: 409,
    Code.REVISION_CONFLICT: 409,
    Code.IDEMPOTENCY_CONFLICT: 409,
    Code.THREAD_BUSY: 409,
    Code.DUPLICATE_TASK: 409,
    Code.RUN_IN_PROGRESS: 409,
    Code.DEAD_LETTER_EXHAUSTED: 409,
    Code.LEASE_NOT_FOUND: 409,
    Code.LEASE_EXPIRED: 409,
    Code.PAYLOAD_TOO_LARGE: 413,
    Code.INVALID_SCHEDULE: 422,
    Code.LAUNCH_FAILED: 502,
    Code.STORAGE_ERROR: 503,
    Code.SERVICE_UNAVAILABLE: 503,
    Code.INTERNAL: 500,
}


def error_response(
    code: str, message: str, request_id: str, details: dict[str, Any] | None = None, status: int | None = None
) -> web.Response:
    body = ErrorEnvelope(ErrorBody(code=code, message=message, request_id=request_id, details=details or {}))
    return web.Response(
        body=msgspec.json.encode(body),
        status=status or STATUS_OF_CODE.get(code, 500),
        content_type="application/json",
        headers={"X-Request-Id": request_id},
    )
