"""The operation table's rows for the task dead-letter queue: list, read, retry, force-retry."""

from __future__ import annotations

from scheduler_gateway.daemon.http.openapi.params import (
    DEAD_LETTER_ID,
    PAGE,
    Op,
    bool_filter,
    filter_param,
    query_param,
)

OPERATIONS: list[Op] = [
    Op(
        "get",
        "/api/deadletter",
        "listDeadLetters",
        "task dead letters (active unless archived=true)",
        "dead letters",
        answer="DeadLetterPage",
        params=[
            *PAGE,
            filter_param("deadReason", "only letters with this dead reason"),
            query_param("retryCount", {"type": "integer"}, "only letters with this many redrives"),
            filter_param("originalTaskId", "only the letter of this task"),
            bool_filter("exhausted", "only exhausted (true) or not exhausted (false) letters"),
            bool_filter("archived", "archived letters instead of active ones"),
        ],
    ),
    Op(
        "get",
        "/api/deadletter/{id}",
        "getDeadLetter",
        "one task dead letter",
        "dead letters",
        answer="DeadLetterView",
        params=[DEAD_LETTER_ID],
    ),
    Op(
        "post",
        "/api/deadletter/{id}/retry",
        "redriveDeadLetter",
        "redrive: requeue the dead task",
        "dead letters",
        answer="RedriveView",
        params=[DEAD_LETTER_ID],
        errors=(403, 409),
    ),
    Op(
        "post",
        "/api/deadletter/{id}/force-retry",
        "forceRedriveDeadLetter",
        "redrive, also an exhausted letter",
        "dead letters",
        answer="RedriveView",
        body="ForceRetryBody",
        params=[DEAD_LETTER_ID],
        errors=(403, 409, 413),
    ),
]
