"""The operation table's rows for the workflows (CONTRACT 2.12): submit, list, read, cancel, retry."""

from __future__ import annotations

from scheduler_gateway.daemon.http.openapi.params import (
    IDEMPOTENCY_KEY,
    PAGE,
    WORKFLOW_ID,
    Op,
    enum_filter,
    filter_param,
)
from scheduler_gateway.daemon.http.workflows import MAX_NAME, WORKFLOW_STATES

WORKFLOW_ACTION_ERRORS = (403, 409, 413)

OPERATIONS: list[Op] = [
    Op(
        "post",
        "/api/workflows",
        "createWorkflow",
        "submit a workflow: 1 to 10,000 tasks with their dependencies, committed at once or not at all",
        "workflows",
        ok=201,
        answer="WorkflowView",
        body="CreateWorkflowBody",
        body_required=True,
        params=[IDEMPOTENCY_KEY],
        errors=(403, 409, 413),
        replay=True,
    ),
    Op(
        "get",
        "/api/workflows",
        "listWorkflows",
        "list workflows, newest first (without their tasks)",
        "workflows",
        answer="WorkflowPage",
        params=[
            *PAGE,
            enum_filter("state", WORKFLOW_STATES, "only workflows in this state"),
            filter_param("name", "only workflows of this name", maxLength=MAX_NAME),
        ],
    ),
    Op(
        "get",
        "/api/workflows/{id}",
        "getWorkflow",
        "one workflow and its tasks",
        "workflows",
        answer="WorkflowView",
        params=[WORKFLOW_ID],
    ),
    Op(
        "post",
        "/api/workflows/{id}/cancel",
        "cancelWorkflow",
        "cancel every task of a workflow that has not ended; the workflow ends canceled",
        "workflows",
        answer="WorkflowView",
        body="WorkflowCancelBody",
        params=[WORKFLOW_ID, IDEMPOTENCY_KEY],
        errors=WORKFLOW_ACTION_ERRORS,
    ),
    Op(
        "post",
        "/api/workflows/{id}/retry",
        "retryWorkflow",
        "run again the tasks named (default: every failed, dead or canceled one) and what did not succeed below them",
        "workflows",
        answer="WorkflowView",
        body="WorkflowRetryBody",
        params=[WORKFLOW_ID, IDEMPOTENCY_KEY],
        errors=WORKFLOW_ACTION_ERRORS,
    ),
]
