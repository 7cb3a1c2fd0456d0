"""The operation table's rows for operations: the audit log, the nodes, drain and undrain."""

from __future__ import annotations

from scheduler_gateway.daemon.http.openapi.params import NODE_ID, PAGE, Op, filter_param

OPERATIONS: list[Op] = [
    Op(
        "get",
        "/api/audit",
        "listAudit",
        "audit entries, oldest first",
        "operations",
        answer="AuditPage",
        params=[
            *PAGE,
            filter_param("objectId", "only entries about this object"),
            filter_param("action", "only entries of this action"),
            filter_param("requestId", "only entries of this request"),
        ],
    ),
    Op("get", "/api/nodes", "listNodes", "the nodes the gateway knows", "operations", answer="NodePage"),
    Op(
        "post",
        "/api/nodes/{id}/drain",
        "drainNode",
        "no new claims for this node (admin)",
        "operations",
        answer="NodeView",
        params=[NODE_ID],
        errors=(403,),
    ),
    Op(
        "post",
        "/api/nodes/{id}/undrain",
        "undrainNode",
        "the node takes work again (admin)",
        "operations",
        answer="NodeView",
        params=[NODE_ID],
        errors=(403,),
    ),
]
