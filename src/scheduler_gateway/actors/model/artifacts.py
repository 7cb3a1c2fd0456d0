"""Artifacts (CONTRACT 2.11, docs/ARTIFACTS.md) as pure rules: the index row, the limits, who may add one.

An artifact belongs to a task: ``(task_id, name)`` is its key. It is added by the node holding the task's
current lease while the task runs, checked against the stored bytes before it is recorded, and never changed or
removed afterwards except with its task (retention). Pure: ``now`` and the limits come in as arguments.
"""

from __future__ import annotations

import msgspec

from scheduler_gateway.wire.artifacts import ArtifactInfo
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument, PayloadTooLarge

from .records import Task
from .task_machine import refuse


class ArtifactRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One index row. ``upload`` is the object store ``nuid`` of its chunks (``<nodeId>.<uploadId>``), ``chunks``
    how many messages hold them; ``removing`` marks a row whose bytes retention is deleting (never listed)."""

    task_id: str
    name: str
    size: int
    sha256: str
    content_type: str
    attempt_no: int
    node_id: str
    created_at: float
    upload: str
    chunks: int
    owner: str = ""
    removing: bool = False

    @property
    def digest_key(self) -> tuple[int, str]:
        return (self.size, self.sha256)


def info_of(r: ArtifactRecord) -> ArtifactInfo:
    """The record as the API, the callbacks and ``ctx.dependencies`` show it."""
    return ArtifactInfo(name=r.name, size=r.size, sha256=r.sha256, content_type=r.content_type)


class ArtifactLimits(msgspec.Struct, frozen=True, kw_only=True):
    """``[artifacts]`` (CONTRACT 1): bytes per artifact, artifacts per task, bytes per task, orphan age."""

    max_bytes: int = 5 * 1024**3
    max_per_task: int = 1000
    max_task_bytes: int = 20 * 1024**3
    orphan_after_s: float = 3600.0


def lease_refusal(
    task: Task | None, task_id: str, node_id: str, lease_id: str, lease_known: bool
) -> GatewayError | None:
    """Why node ``node_id`` may not add an artifact to ``task`` under ``lease_id`` now, or None: the task runs
    and that lease is its current one, held by that node. An old lease of the task is LEASE_EXPIRED (``lease_known``:
    the store's history has it), an unknown one LEASE_NOT_FOUND, a terminal task TASK_ALREADY_TERMINAL, another
    node's lease FORBIDDEN."""
    if task is None:
        return Conflict(f"lease {lease_id} not found", code=Code.LEASE_NOT_FOUND)
    if task.lease_id == lease_id and task.state == "running":
        if task.node_id != node_id:
            return GatewayError(f"lease {lease_id} is another node's", code=Code.FORBIDDEN)
        return None
    if task.terminal:
        return refuse(task, "put_artifact")
    if lease_known:
        return Conflict(f"lease {lease_id} has expired", code=Code.LEASE_EXPIRED)
    return Conflict(f"lease {lease_id} not found", code=Code.LEASE_NOT_FOUND)


def name_refusal(problem: str | None) -> InvalidArgument | None:
    return None if problem is None else InvalidArgument(problem, details={"field": "name"})


def room(limits: ArtifactLimits, count: int, task_bytes: int) -> int:
    """The most bytes one more artifact may have, given the task's ``count`` and ``task_bytes`` recorded so far;
    raises PAYLOAD_TOO_LARGE when the task may take no more artifacts."""
    if count >= limits.max_per_task:
        raise PayloadTooLarge(
            f"a task holds at most {limits.max_per_task} artifacts",
            details={"limit": "max_per_task", "max": limits.max_per_task},
        )
    left = limits.max_task_bytes - task_bytes
    if left <= 0:
        raise PayloadTooLarge(
            f"a task's artifacts hold at most {limits.max_task_bytes} bytes",
            details={"limit": "max_task_bytes", "max": limits.max_task_bytes},
        )
    return min(limits.max_bytes, left)


def size_refusal(limits: ArtifactLimits, size: int, count: int, task_bytes: int) -> PayloadTooLarge | None:
    """PAYLOAD_TOO_LARGE when an artifact of ``size`` bytes would break a limit, else None."""
    if size > limits.max_bytes:
        return PayloadTooLarge(
            f"an artifact holds at most {limits.max_bytes} bytes",
            details={"limit": "max_bytes", "max": limits.max_bytes, "size": size},
        )
    try:
        left = room(limits, count, task_bytes)
    except PayloadTooLarge as exc:
        return exc
    if size > left:
        return PayloadTooLarge(
            f"a task's artifacts hold at most {limits.max_task_bytes} bytes",
            details={"limit": "max_task_bytes", "max": limits.max_task_bytes, "size": size},
        )
    return None


def repeat_or_conflict(existing: ArtifactRecord, size: int, sha256: str) -> bool:
    """The same name again: True (a repeat) when the digest is the same, else IDEMPOTENCY_CONFLICT."""
    if existing.digest_key == (size, sha256):
        return True
    raise Conflict(
        f"artifact {existing.name!r} is already recorded with another digest",
        code=Code.IDEMPOTENCY_CONFLICT,
        details={"name": existing.name, "sha256": existing.sha256, "size": existing.size},
    )


def event_data(record: ArtifactRecord) -> dict[str, object]:
    """The ``task.artifact_added`` event's data (CONTRACT 2.11)."""
    return {"name": record.name, "size": record.size, "sha256": record.sha256, "contentType": record.content_type}


def expired_upload(*, gone: bool = False) -> InvalidArgument:
    """An upload whose chunks may be (or were) removed as an orphan: refused, for the node to upload again."""
    why = "its chunks are gone" if gone else "its chunks are too old (the keeper may remove them)"
    return InvalidArgument(
        f"the upload cannot be recorded: {why}; upload the artifact again",
        details={"field": "uploadId", "reason": "gone" if gone else "expired"},
    )


def missing_bytes(record: ArtifactRecord) -> GatewayError:
    """A recorded artifact whose bytes the bucket does not hold (removed behind the index, a bucket restored from
    an older copy): STORAGE_ERROR (503), for the reader to try again later or an operator to look."""
    return GatewayError(
        f"the bytes of artifact {record.name!r} are missing from the bucket",
        code=Code.STORAGE_ERROR,
        details={"name": record.name, "reason": "bytes_missing"},
    )
