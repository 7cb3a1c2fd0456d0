"""A workflow's tasks as submitted (``POST /api/workflows``) or added at run time (``ctx.add_tasks``): each raw
item decoded alone and checked by the usual create rules, the graph checked (refs unique and known, no edge
twice, no cycle), and the tasks and edges it commits built (CONTRACT 2.12).

Every refusal names the item whose entry is wrong in ``details.ref`` (``details.index`` when the item has no
readable ref), and a cycle lists the refs of one cycle in order in ``details.cycle``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable

import msgspec

from scheduler_gateway.wire.api import CreateTaskBody
from scheduler_gateway.wire.errors import GatewayError, InvalidArgument
from scheduler_gateway.wire.workflows import REF_RULE, WorkflowTaskBody, is_ref

from .. import idgen
from ..model.records import Dependency, Task
from ..model.workflows import Edge
from ..tasks import Caller, NewTask, TaskPolicy, check_labels, new_task, spec_of

#: turns one item's task body into a create (the HTTP layer's rules: payload size, callback URL, notBefore...)
NewTaskRule = Callable[[CreateTaskBody], NewTask]


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One decoded item: its body, the create it asks, and the digest of its body (a repeat of ``add_tasks``)."""

    body: WorkflowTaskBody
    spec: NewTask
    digest: str | None


def refused(exc: GatewayError, ref: str | None, index: int) -> GatewayError:
    """The item's own refusal (its code kept), naming the item."""
    details = dict(exc.details)
    details["ref" if ref is not None else "index"] = ref if ref is not None else index
    if ref is not None:
        details.setdefault("index", index)
    return type(exc)(f"task {ref or f'#{index}'}: {exc.message}", code=exc.code, details=details)


def _ref_of(raw: bytes) -> str | None:
    """The item's ref when it can be read (to name an item that does not decode whole)."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    ref = value.get("ref") if isinstance(value, dict) else None
    return ref if is_ref(ref) else None


def digest(raw: bytes) -> str:
    """The item's body, canonical (keys sorted), hashed: the same body sent again has the same digest."""
    value = msgspec.json.decode(raw)
    return hashlib.sha256(msgspec.json.encode(value, order="sorted")).hexdigest()[:32]


def default_rule(body: CreateTaskBody) -> NewTask:
    """The create rules that need no HTTP settings (the gateway gives the HTTP layer's own, which also checks the
    payload's size and the callback URL's target)."""
    if body.callback_secret is not None and body.callback_url is None:
        raise InvalidArgument("callbackSecret needs a callbackUrl", details={"field": "callbackSecret"})
    return spec_of(body)


async def decode_items(
    caller: Caller,
    raws: list[msgspec.Raw],
    rule: NewTaskRule,
    thread_check: Callable[[Caller, str], Awaitable[None]] | None,
    *,
    digests: bool = False,
) -> list[Item]:
    """Each item decoded alone and held to a single create's rules (labels, parentId refused, thread), in order;
    the first wrong one refuses the whole request, naming it. ``digests``: each item's body digest is kept (an
    added task's, to know a repeat)."""
    items: list[Item] = []
    refs: set[str] = set()
    threads: set[str] = set()  # each thread checked once per request
    for n, raw in enumerate(raws):
        data = bytes(raw)
        try:
            try:
                body = msgspec.json.decode(data, type=WorkflowTaskBody)
            except msgspec.ValidationError as exc:
                raise InvalidArgument(f"invalid task body: {exc}") from None
            except msgspec.DecodeError:
                raise InvalidArgument("a task is not a JSON object") from None
            if body.parent_id is not None:
                why = "parentId is not allowed in a workflow (dependsOn says it)"
                raise InvalidArgument(why, details={"field": "parentId"})
            spec = rule(body)
            check_labels(caller, spec.labels)
            if spec.thread_id is not None and thread_check is not None and spec.thread_id not in threads:
                await thread_check(caller, spec.thread_id)
                threads.add(spec.thread_id)
        except GatewayError as exc:
            raise refused(exc, _ref_of(data), n) from None
        if body.ref in refs:
            raise InvalidArgument(f"ref {body.ref} names two tasks", details={"ref": body.ref, "index": n})
        refs.add(body.ref)
        items.append(Item(body=body, spec=spec, digest=digest(data) if digests else None))
    return items


def check_edges(items: list[Item], known: Iterable[str] = ()) -> None:
    """Every ``dependsOn`` names a ref of the request (or ``known``, the workflow's other tasks), no parent twice
    in one task, and the request's tasks make no cycle."""
    own = {it.body.ref for it in items}
    known_refs = set(known)
    for it in items:
        seen: set[str] = set()
        for dep in it.body.depends_on:
            if dep.ref not in own and dep.ref not in known_refs:
                raise InvalidArgument(
                    f"task {it.body.ref} depends on {dep.ref}, which names no task of the workflow",
                    details={"ref": it.body.ref, "dependsOn": dep.ref},
                )
            if dep.ref in seen:
                raise InvalidArgument(
                    f"task {it.body.ref} depends on {dep.ref} twice", details={"ref": it.body.ref, "dependsOn": dep.ref}
                )
            seen.add(dep.ref)
    cycle = find_cycle({it.body.ref: [d.ref for d in it.body.depends_on if d.ref in own] for it in items})
    if cycle is not None:
        raise InvalidArgument(
            f"the dependencies make a cycle: {' -> '.join([*cycle, cycle[0]])[:500]}",
            details={"ref": cycle[0], "cycle": cycle},
        )


def find_cycle(parents: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the graph ``ref -> the refs it depends on``, in dependency order (each ref depends on the
    next, the last on the first), or None. Iterative: a chain of 10,000 does not reach the recursion limit."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in parents:
        if start in state:
            continue
        path: list[str] = [start]
        todo: list[list[str]] = [list(parents.get(start, ()))]
        state[start] = 1
        while path:
            if not todo[-1]:
                state[path.pop()] = 2
                todo.pop()
                continue
            nxt = todo[-1].pop()
            mark = state.get(nxt)
            if mark == 1:
                return path[path.index(nxt) :]
            if mark is None:
                state[nxt] = 1
                path.append(nxt)
                todo.append(list(parents.get(nxt, ())))
    return None


def check_ref(value: str) -> None:
    if not is_ref(value):
        raise InvalidArgument(REF_RULE, details={"ref": value[:64]})


def build_tasks(
    caller: Caller,
    items: list[Item],
    policy: TaskPolicy,
    now: float,
    *,
    workflow_id: str,
    max_parallel: int | None,
    ids_of: dict[str, str],
    added_by: str | None = None,
) -> tuple[list[Task], list[Edge]]:
    """One task per item (a single create's defaults) and one edge per ``dependsOn`` entry; ``ids_of`` holds the
    workflow's other tasks by ref and takes the new ones."""
    for it in items:
        ids_of[it.body.ref] = idgen.new_id("tsk")
    tasks: list[Task] = []
    edges: list[Edge] = []
    for it in items:
        spec, body = it.spec, it.body
        deps = tuple(Dependency(d.ref, d.on) for d in body.depends_on)
        task = new_task(
            spec, caller.user, policy, now,
            id=ids_of[body.ref], workflow_id=workflow_id, ref=body.ref, depends_on=deps, join=body.join,
            waiting_deps=bool(deps), workflow_max_parallel=max_parallel, added_by=added_by, spec_digest=it.digest,
        )  # fmt: skip
        tasks.append(task)
        edges.extend(
            Edge(workflow_id=workflow_id, parent_id=ids_of[d.ref], parent_ref=d.ref, child_id=task.id, on=d.on)
            for d in body.depends_on
        )
    return tasks, edges
