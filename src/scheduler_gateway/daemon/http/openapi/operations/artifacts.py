"""The operation table's rows for artifacts (docs/ARTIFACTS.md): a task's list. The download, whose answer is
bytes rather than JSON, is described by ``download_operation`` (added to the document beside the table)."""

from __future__ import annotations

from typing import Any

from scheduler_gateway.daemon.http.openapi.params import PAGE, TASK_ID, Op

OPERATIONS: list[Op] = [
    Op(
        "get",
        "/api/tasks/{id}/artifacts",
        "listArtifacts",
        "a task's artifacts, oldest first",
        "artifacts",
        answer="ArtifactPage",
        params=[TASK_ID, *PAGE],
    ),
]

DOWNLOAD_PATH = "/api/tasks/{id}/artifacts/{name}"
_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "the artifact's name (it may hold `/`)",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[A-Za-z0-9._/-]{1,255}$"},
}


def download_operation(error: Any) -> dict[str, Any]:
    """``GET`` (and ``HEAD``, the same without the body) of one artifact's bytes; ``error(status)`` is the
    document's error answer."""
    headers = {
        "X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"},
        "ETag": {"description": 'the sha256, quoted: `"<sha256>"`', "schema": {"type": "string"}},
        "Content-Length": {"schema": {"type": "integer"}},
        "Content-Disposition": {"description": "`attachment; filename=...`", "schema": {"type": "string"}},
        "Accept-Ranges": {"schema": {"type": "string", "enum": ["bytes"]}},
    }
    body = {"*/*": {"schema": {"type": "string", "format": "binary"}}}
    return {
        "operationId": "getArtifact",
        "summary": "one artifact's bytes, streamed; HEAD answers the headers alone",
        "tags": ["artifacts"],
        "parameters": [
            TASK_ID,
            _NAME,
            {"name": "Range", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "one range `bytes=a-b`, `bytes=a-` or `bytes=-n`: answers 206; a header that is not one "
                            "such range (several ranges, another unit, last before first) is ignored: 200"},
            {"name": "If-None-Match", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "the ETag of a copy the client holds: answers 304 when it is this artifact's"},
        ],
        "responses": {
            "200": {"description": "the bytes, with the artifact's Content-Type", "headers": headers, "content": body},
            "206": {
                "description": "the range asked for",
                "headers": {**headers, "Content-Range": {"schema": {"type": "string"}}},
                "content": body,
            },
            "304": {"description": "the client's copy (If-None-Match) is this artifact", "headers": headers},
            "416": {
                "description": "the range is outside the artifact (`Content-Range: bytes */<size>`)",
                "headers": {"Content-Range": {"schema": {"type": "string"}}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
            },
            **{str(s): error(s) for s in (401, 404, 500, 503)},
        },
    }  # fmt: skip
