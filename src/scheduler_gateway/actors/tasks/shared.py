"""Several instances on one store (``TaskService.share``; actors/shared_tasks.py): another instance's writes taken
into the live copies, and a heartbeat's lease extensions persisted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import ExtendedLease, RevokedLease
from scheduler_gateway.wire.timefmt import fmt_ts

from ..model.records import Task

if TYPE_CHECKING:
    from .service import TaskService


def absorb(svc: TaskService, stored: Task | None, task_id: str) -> None:
    """Take a stored copy that another instance wrote into the live copies (and so into the dispatcher and the
    lease clock). A copy no newer than the live one changes nothing but the lease expiry a heartbeat elsewhere
    moved."""
    live = svc._live.get(task_id)
    if stored is None:
        return
    if live is not None and stored.revision <= live.revision:
        if stored.revision == live.revision and stored.lease_expires_at != live.lease_expires_at:
            svc._live[task_id] = stored
            if stored.lease_id is not None and stored.lease_expires_at is not None:
                svc.lease_clock.extend(task_id, stored.lease_id, stored.lease_expires_at)
        return
    if live is None and stored.terminal:
        return
    if stored.terminal:
        del svc._live[task_id]
    else:
        svc._live[task_id] = stored
    if live is not None and live.state == "running" and (stored.state != "running" or stored.lease_id != live.lease_id):
        svc.lease_clock.forget(task_id)
    if stored.state == "running" and (live is None or live.state != "running" or live.lease_id != stored.lease_id):
        svc._watch(stored)
    svc._dispatcher.update(stored)


async def persist_extensions(
    svc: TaskService,
    items: list[tuple[Task, Task]],
    now: float,
    extended: list[ExtendedLease],
    revoked: list[RevokedLease],
) -> None:
    """Write the new lease expiries of one heartbeat in one statement; a lease whose row changed or ran out since
    it was read is revoked (the lease watcher or a settle got there first)."""
    assert svc._shared is not None
    moved = await svc._shared.extend_leases(
        [(new.id, old.revision, new.lease_expires_at or now, now) for old, new in items]
    )
    for _, new in items:
        lease_id = new.lease_id or ""
        if new.id not in moved:
            revoked.append(RevokedLease(task_id=new.id, lease_id=lease_id, reason=Code.LEASE_EXPIRED))
            continue
        live = svc._live.get(new.id)
        if live is not None and live.revision == new.revision:
            svc._live[new.id] = new
            svc.lease_clock.extend(new.id, lease_id, new.lease_expires_at or now)
        extended.append(
            ExtendedLease(task_id=new.id, lease_id=lease_id, lease_expires_at=fmt_ts(new.lease_expires_at) or "")
        )
