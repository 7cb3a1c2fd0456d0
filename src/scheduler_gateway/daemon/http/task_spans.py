"""The create span of ``POST /api/tasks`` and of each item of ``POST /api/tasks/batch`` (docs/OPERATIONS.md,
Tracing): a child of the caller's ``traceparent`` (the body's field, else the request's header), or a new root
when there is none, whose context the task then keeps. Without OpenTelemetry loaded nothing is made and the
task keeps the caller's ``traceparent`` as it came (a malformed one is dropped, never refused)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import msgspec

from scheduler_gateway import tracing
from scheduler_gateway.actors.tasks import BatchItem, BatchOutcome, Caller, NewTask
from scheduler_gateway.wire import tracecontext
from scheduler_gateway.wire.errors import GatewayError

TRACER = "scheduler_gateway.gatewayd"


@contextmanager
def create_span(caller: Caller, spec: NewTask, header: str | None) -> Iterator[tuple[NewTask, tracing.Scope]]:
    """``spec`` with the ``traceparent`` its task keeps, inside the create span."""
    parent = spec.traceparent or tracecontext.normalized(header)
    attributes = {"gw.task.kind": spec.kind, "gw.owner": caller.user}
    with tracing.span(TRACER, f"create {spec.kind}", parent, kind="server", attributes=attributes, current=False) as s:
        keeps = parent or s.traceparent
        yield (spec if keeps == spec.traceparent else msgspec.structs.replace(spec, traceparent=keeps)), s


_NO_SPAN = tracing.Scope(None, None)  # the scope of every item while OpenTelemetry is not loaded


def created(scope: tracing.Scope, task_id: str, replayed: bool) -> None:
    scope.set("gw.task.id", task_id)
    scope.set("gw.replayed", replayed)


@contextmanager
def create_spans(
    caller: Caller, items: Sequence[BatchItem], header: str | None
) -> Iterator[tuple[list[BatchItem], list[tracing.Scope]]]:
    """One create span per item of a batch (each item's own ``traceparent``, else the request's header)."""
    if not tracing.loaded():  # what create_span does then, without a context manager per item (a hot path)
        inherited = tracecontext.normalized(header)
        if inherited is not None:
            new = msgspec.structs.replace
            items = [i if i.spec.traceparent else new(i, spec=new(i.spec, traceparent=inherited)) for i in items]
        yield list(items), [_NO_SPAN] * len(items)
        return
    with ExitStack() as stack:
        traced: list[BatchItem] = []
        scopes: list[tracing.Scope] = []
        for item in items:
            spec, scope = stack.enter_context(create_span(caller, item.spec, header))
            traced.append(item if spec is item.spec else msgspec.structs.replace(item, spec=spec))
            scopes.append(scope)
        yield traced, scopes


def batch_created(scopes: Sequence[tracing.Scope], outcomes: Sequence[BatchOutcome]) -> None:
    if scopes and scopes[0] is _NO_SPAN:
        return
    for scope, outcome in zip(scopes, outcomes, strict=True):
        if isinstance(outcome, GatewayError):
            scope.fail(outcome.code, outcome.message)
        else:
            created(scope, outcome[0].id, outcome[1])
