"""The OpenAPI document (docs/API.md) names exactly the /api routes the app registers, with every
method, and it is a valid OpenAPI 3.1 document; the error envelope it describes is what errors carry."""

from __future__ import annotations

import msgspec
from openapi_spec_validator import validate

from scheduler_gateway.daemon.http.errors import error_response
from scheduler_gateway.daemon.http.openapi import build_document, document_bytes
from scheduler_gateway.wire.api import ErrorEnvelope
from tests.test_docs_links import _app


def _registered() -> set[tuple[str, str]]:
    return {
        (r.method.lower(), r.resource.canonical)
        for r in _app().router.routes()
        if r.resource and r.method != "HEAD" and r.resource.canonical.startswith("/api/")
    }


def test_every_api_route_is_in_the_document_and_nothing_else() -> None:
    doc = build_document()
    documented = {(m, path) for path, ops in doc["paths"].items() for m in ops}
    assert len(documented) > 30
    assert documented == _registered()


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = msgspec.json.decode(document_bytes())
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_security_everywhere_but_the_document_itself() -> None:
    doc = build_document()
    assert doc["security"] == [{"bearerAuth": []}]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path == "/api/openapi.json":
                assert op["security"] == []
            else:
                assert "security" not in op, (method, path)
                assert "401" in op["responses"], (method, path)


def test_sse_route_declares_its_event_schemas() -> None:
    doc = build_document()
    ok = doc["paths"]["/api/events"]["get"]["responses"]["200"]
    assert "text/event-stream" in ok["content"]
    events = ok["x-sse-events"]
    assert events["task.created"] == {"$ref": "#/components/schemas/Event"}
    assert {"gap", "disconnect"} <= set(events)
    props = doc["components"]["schemas"]["Event"]["properties"]
    assert {"seq", "type", "aggregateType", "aggregateId", "revision", "at", "requestId", "data"} <= set(props)


def test_error_responses_carry_the_envelope_the_document_describes() -> None:
    resp = error_response("TASK_NOT_FOUND", "task x not found", "req_1", {"field": "id"})
    assert resp.body is not None
    env = msgspec.json.decode(resp.body, type=ErrorEnvelope, strict=True)
    assert env.error.code == "TASK_NOT_FOUND"
    assert msgspec.json.decode(resp.body) == {
        "error": {
            "code": "TASK_NOT_FOUND",
            "message": "task x not found",
            "requestId": "req_1",
            "details": {"field": "id"},
        }
    }
