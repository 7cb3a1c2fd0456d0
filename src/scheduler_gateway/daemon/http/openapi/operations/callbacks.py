"""The operation table's rows for the callback dead-letter queue: list, read, redeliver."""

from __future__ import annotations

from scheduler_gateway.daemon.http.openapi.params import CALLBACK_LETTER_ID, PAGE, Op, filter_param

OPERATIONS: list[Op] = [
    Op(
        "get",
        "/api/callbacks/deadletter",
        "listCallbackDeadLetters",
        "callback deliveries that gave up",
        "callbacks",
        answer="CallbackDeadLetterPage",
        params=[*PAGE, filter_param("taskId", "only letters of this task")],
    ),
    Op(
        "get",
        "/api/callbacks/deadletter/{id}",
        "getCallbackDeadLetter",
        "one callback dead letter",
        "callbacks",
        answer="CallbackDeadLetterView",
        params=[CALLBACK_LETTER_ID],
    ),
    Op(
        "post",
        "/api/callbacks/deadletter/{id}/redeliver",
        "redeliverCallback",
        "queue the delivery again; answers the letter as it was",
        "callbacks",
        answer="CallbackDeadLetterView",
        params=[CALLBACK_LETTER_ID],
        errors=(403, 409),
    ),
]
