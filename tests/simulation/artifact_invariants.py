"""The artifact invariants (docs/INVARIANTS.md, Artifacts), over the durable index and the simulated bucket.

Checked after every step:
- ``artifact_has_its_bytes``: every listed row's upload holds, in its first ``chunks`` chunks, exactly ``size``
  bytes with that sha256 (a download reads exactly those);
- ``artifacts_go_with_their_task``: no row of a task the store no longer has;
- ``artifact_under_its_lease`` (at each record, from the store hook): the task's history at the revision the
  row was recorded at shows the task running its attempt ``attempt_no`` on the row's node.
Checked once a long enough clock step let the keeper run (``due``):
- ``artifacts_go_with_their_task``: no row of a task finished longer ago than the retention and two rounds;
- ``no_orphan_after_its_age``: no chunks or object no row names, stored longer ago than ``orphan_after_s`` and
  two rounds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from scheduler_gateway.actors.model.artifacts import ArtifactRecord
from scheduler_gateway.actors.model.records import TERMINAL_STATES, HistoryEntry, Task
from scheduler_gateway.wire.artifacts import object_name

from .sim_world import ARTIFACT_KEEP_TASKS_S, ARTIFACT_KEEPER_S, ARTIFACT_LIMITS, MAX_SKEW_S, SimBucket

#: two keeper rounds and the clocks' skew: what "past its age" allows the keeper
SLACK_S = 2 * ARTIFACT_KEEPER_S + 2 * MAX_SKEW_S + 1.0


def artifact_violations(
    rows: list[ArtifactRecord], tasks: dict[str, Task], bucket: SimBucket, now: float, *, due: bool
) -> list[str]:
    out: list[str] = []
    named_uploads = {r.upload for r in rows}
    named_objects = {object_name(r.task_id, r.name) for r in rows}
    for r in rows:
        where = f"artifact {r.task_id}/{r.name}"
        if r.task_id not in tasks:
            out.append(f"artifacts_go_with_their_task: {where} is indexed, its task is gone")
            continue
        if not r.removing:
            data = bucket.bytes_of(r.upload, r.chunks)
            if data is None:
                out.append(f"artifact_has_its_bytes: {where}: upload {r.upload} holds fewer than {r.chunks} chunks")
            elif len(data) != r.size or hashlib.sha256(data).hexdigest() != r.sha256:
                out.append(f"artifact_has_its_bytes: {where}: the stored bytes are not its {r.size} bytes")
        task = tasks[r.task_id]
        finished = task.finished_at if task.state in TERMINAL_STATES else None
        if due and finished is not None and finished < now - ARTIFACT_KEEP_TASKS_S - SLACK_S:
            out.append(f"artifacts_go_with_their_task: {where} is still indexed; its task finished at {finished:.1f}")
    if due:
        cutoff = now - ARTIFACT_LIMITS.orphan_after_s - SLACK_S
        for upload, chunks in bucket.chunks.items():
            if chunks and upload not in named_uploads and chunks[-1][1] < cutoff:
                out.append(f"no_orphan_after_its_age: upload {upload} (no row) last written at {chunks[-1][1]:.1f}")
        for name, (upload, at) in bucket.metas.items():
            if name not in named_objects and at < cutoff:
                out.append(f"no_orphan_after_its_age: object {name} (upload {upload}, no row) written at {at:.1f}")
    return out


def recorded_under_its_lease(
    record: ArtifactRecord, revision: int | None, history_after: Callable[[str, int], list[HistoryEntry]]
) -> str | None:
    """The store hook's check of one recorded row; ``revision`` is the task's revision the lease was checked at."""
    if revision is None:
        return (
            f"artifact_under_its_lease: {record.task_id}/{record.name} recorded without the revision it was checked at"
        )
    entries: list[Any] = [h for h in history_after(record.task_id, revision - 1) if h.revision == revision]
    if not entries:
        return None  # that revision wrote no history (nothing to compare)
    h = entries[0]
    if h.to_state != "running" or h.node_id != record.node_id or h.attempt_no != record.attempt_no:
        return (
            f"artifact_under_its_lease: {record.task_id}/{record.name} recorded for node {record.node_id} attempt "
            f"{record.attempt_no} at revision {revision}, where the task was {h.to_state} on {h.node_id} "
            f"(attempt {h.attempt_no})"
        )
    return None
