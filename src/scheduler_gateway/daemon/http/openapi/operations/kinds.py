"""The operation table's rows for kinds and their flow settings (docs/FLOW.md)."""

from __future__ import annotations

from scheduler_gateway.daemon.http.openapi.params import PAGE, Op
from scheduler_gateway.wire.names import KIND_MAX, KIND_SHAPE, ecma_pattern

KIND = {
    "name": "kind",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": KIND_MAX, "pattern": ecma_pattern(KIND_SHAPE)},
    "description": "the kind's name; out of pattern answers 400",
}

OPERATIONS: list[Op] = [
    Op("get", "/api/kinds", "listKinds", "every kind with tasks, settings or a node, by name", "kinds",
       answer="KindList", params=[*PAGE], errors=(400,)),
    Op("get", "/api/kinds/{kind}", "getKind", "a kind's flow settings and counts", "kinds", answer="KindView",
       params=[KIND], errors=(400,)),
    Op("put", "/api/kinds/{kind}", "updateKind",
       "change the fields sent (admin); null removes a limit", "kinds", answer="KindView", body="UpdateKindBody",
       body_required=True, params=[KIND], errors=(400, 403)),
    Op("post", "/api/kinds/{kind}/pause", "pauseKind", "start nothing of this kind (admin); running tasks go on",
       "kinds", answer="KindView", params=[KIND], errors=(400, 403)),
    Op("post", "/api/kinds/{kind}/resume", "resumeKind", "start the kind's queue again, in its order (admin)",
       "kinds", answer="KindView", params=[KIND], errors=(400, 403)),
]  # fmt: skip
