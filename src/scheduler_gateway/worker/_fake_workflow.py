"""``FakeWorkflow`` of ``scheduler_gateway.worker.testing``: a workflow task's dependencies and ``add_tasks`` in a
handler's test, without a gateway, answering as the gateway would (docs/WORKERS.md, Testing handlers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.workflows import WorkflowTaskBody

from ._workflow import Dependency, WorkflowRefused, encode_items

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _through_json(value: Any) -> Any:
    return _decode(_encode(value))


def _dependency(ref: str, given: Dependency | Mapping[str, Any]) -> Dependency:
    """A parent as a test gives it: a ``Dependency``, or a dict of its fields (state ``succeeded`` by default;
    ``task_id`` / ``taskId`` ``tsk_<ref>``), its values passed through JSON as on the wire."""
    if isinstance(given, Dependency):
        return given
    fields = dict(given)
    return Dependency(
        ref=ref,
        task_id=str(fields.get("task_id") or fields.get("taskId") or f"tsk_{ref}"),
        state=str(fields.get("state", "succeeded")),
        result=_through_json(fields.get("result")),
        error=_through_json(fields.get("error")),
        artifacts=_through_json(list(fields.get("artifacts", []))),
        on=str(fields.get("on", "succeeded")),
    )


class FakeWorkflow:
    """A handler's workflow in a test: ``dependencies`` what ``ctx.dependencies`` holds, ``calls`` every
    ``ctx.add_tasks`` call (its tasks as the JSON objects sent), ``added`` each task added (ref -> task id, in
    order). ``refs``: refs the workflow holds already from elsewhere (its other tasks): adding one is refused, and
    ``dependsOn`` may name them. ``refuse``: a ``WorkflowRefused`` the next ``add_tasks`` raises (as a gateway that
    refused it, the lease gone say)."""

    def __init__(
        self, dependencies: Mapping[str, Dependency | Mapping[str, Any]] | None = None, *, refs: Iterable[str] = ()
    ) -> None:
        self.dependencies: dict[str, Dependency] = {
            ref: _dependency(ref, given) for ref, given in sorted((dependencies or {}).items())
        }
        self.refs: set[str] = set(refs) | set(self.dependencies)
        self.calls: list[list[dict[str, Any]]] = []
        self.added: dict[str, str] = {}
        self.refuse: WorkflowRefused | None = None
        self._bodies: dict[str, bytes] = {}  # an added ref's body as sent, to tell a repeat from a conflict

    async def dependencies_of(self) -> Mapping[str, Dependency]:
        return MappingProxyType(dict(self.dependencies))

    async def add_tasks(self, tasks: Sequence[Any]) -> list[tuple[str, str]]:
        items = encode_items(tasks)
        self.calls.append([_decode(bytes(item)) for item in items])
        if self.refuse is not None:
            refusal, self.refuse = self.refuse, None
            raise refusal
        bodies = _bodies(items)
        if all(self._bodies.get(b.ref) == raw for b, raw in bodies):
            return [(b.ref, self.added[b.ref]) for b, _ in bodies]  # a repeat: the same ids
        self._check(bodies)
        for b, raw in bodies:
            self._bodies[b.ref] = raw
            self.added[b.ref] = f"tsk_added_{len(self.added) + 1}"
        return [(b.ref, self.added[b.ref]) for b, _ in bodies]

    def _check(self, bodies: list[tuple[WorkflowTaskBody, bytes]]) -> None:
        """Refuse what the gateway refuses: a ref added before (with another body), one the workflow holds from
        elsewhere, a ``dependsOn`` naming a ref the workflow does not hold."""
        for b, _ in bodies:
            if b.ref in self._bodies:
                message = f"ref {b.ref!r} was added before with another body"
                raise WorkflowRefused(Code.IDEMPOTENCY_CONFLICT, message, {"ref": b.ref})
            if b.ref in self.refs:
                raise WorkflowRefused(Code.INVALID_ARGUMENT, f"the workflow holds ref {b.ref!r}", {"ref": b.ref})
        known = self.refs | set(self.added) | {b.ref for b, _ in bodies}
        for b, _ in bodies:
            for dep in b.depends_on:
                if dep.ref not in known:
                    message = f"dependsOn names an unknown ref {dep.ref!r}"
                    raise WorkflowRefused(Code.INVALID_ARGUMENT, message, {"ref": b.ref})


def _bodies(items: list[msgspec.Raw]) -> list[tuple[WorkflowTaskBody, bytes]]:
    """Each item decoded as the gateway decodes it (a bad one: INVALID_ARGUMENT naming its ref), refs unique."""
    bodies: list[tuple[WorkflowTaskBody, bytes]] = []
    for i, item in enumerate(items):
        try:
            bodies.append((msgspec.json.decode(bytes(item), type=WorkflowTaskBody), bytes(item)))
        except msgspec.ValidationError as exc:
            ref = _decode(bytes(item)).get("ref")
            raise WorkflowRefused(Code.INVALID_ARGUMENT, str(exc), {"ref": ref, "index": i}) from None
    refs = [b.ref for b, _ in bodies]
    for ref in refs:
        if refs.count(ref) > 1:
            raise WorkflowRefused(Code.INVALID_ARGUMENT, f"ref {ref!r} appears twice", {"ref": ref})
    return bodies


class WorkflowSinkOf:
    """A ``FakeWorkflow`` as the context's ``WorkflowSink`` (what ``HandlerRun`` gives its handler's context)."""

    def __init__(self, fake: FakeWorkflow) -> None:
        self._fake = fake

    async def dependencies(self) -> Mapping[str, Dependency]:
        return await self._fake.dependencies_of()

    async def add_tasks(self, tasks: Sequence[Any]) -> list[tuple[str, str]]:
        return await self._fake.add_tasks(tasks)
