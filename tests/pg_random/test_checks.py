"""The two-instance test's checks can fail: each is shown the rows of the defect it is there to find."""

from __future__ import annotations

from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import ActorRef, DeadLetter, HistoryEntry, Task
from tests.test_store_contract import make_task

from .checks import KindLog, flow_violations, letter_violations
from .world import Rows

T0 = 1_800_000_000.0


def entry(task: Task, revision: int, before: str | None, after: str, action: str, at: float) -> HistoryEntry:
    return HistoryEntry(
        task_id=task.id,
        revision=revision,
        from_state=before,
        to_state=after,
        action=action,
        actor=ActorRef("user", "root"),
        reason=None,
        at=at,
        attempt_id=None,
        attempt_no=1,
        lease_id=None,
        node_id=None,
        request_id=None,
    )


def rows(tasks: list[Task], kinds: list[KindSettings], **more: object) -> Rows:
    return Rows(
        tasks={t.id: t for t in tasks},
        history=more.get("history", {}),  # type: ignore[arg-type]
        letters=more.get("letters", {}),  # type: ignore[arg-type]
        kinds={k.kind: k for k in kinds},
    )


def test_a_letter_whose_redrive_was_written_over_is_named() -> None:
    task = make_task(1, state="queued", revision=5)
    history = [
        entry(task, 1, None, "queued", "create", T0),
        entry(task, 2, "queued", "running", "claim", T0 + 1),
        entry(task, 3, "running", "dead", "settle", T0 + 2),
        entry(task, 4, "dead", "queued", "redrive", T0 + 3),
    ]
    letter = DeadLetter(
        dead_letter_id="dlq_1",
        task_id=task.id,
        original_task_id=task.id,
        owner="alice",
        dead_reason="HANDLER_ERROR",
        retry_count=0,  # the keeper wrote back what it read before the redrive
        requeued=True,
        first_dead_at=T0 + 2,
        last_dead_at=T0 + 1,
    )
    found = letter_violations(rows([task], [], history={task.id: history}, letters={task.id: letter}), 2)
    assert any("retryCount 0 but its history has 1" in v for v in found), found
    assert any("lastDeadAt" in v for v in found), found


def test_an_acknowledged_change_lost_to_a_concurrent_one_is_named() -> None:
    log = KindLog()
    pause = log.begin("work", {"paused": True}, "#1 pause@A")
    put = log.begin("work", {"concurrency": 3}, "#1 kind_put@B")
    log.end(put, acked=True)
    log.end(pause, acked=True)
    stored = KindSettings(kind="work", paused=False, concurrency=3)  # the PUT wrote back the pause it had not seen
    assert log.violations(rows([], [stored])) == [
        "kind work: paused is False but the acknowledged #1 pause@A set paused=True (and nothing later)"
    ]
    later = log.begin("work", {"paused": False}, "#2 resume@B")
    log.end(later, acked=True)
    assert log.violations(rows([], [stored])) == []  # a later acknowledged change of the field replaced it


def test_a_paused_kind_that_started_a_task_is_named() -> None:
    paused = KindSettings(kind="work", paused=True)
    queued, running = make_task(1, kind="work"), make_task(1, kind="work", state="running", revision=2)
    assert flow_violations(rows([queued], [paused]), rows([running], [paused]), set()) == [
        "kind work (paused): 1 running after the step, 0 before"
    ]
    assert flow_violations(rows([queued], [paused]), rows([running], [paused]), {"work"}) == []
    limited = KindSettings(kind="work", key_concurrency=1)
    two = [make_task(n, kind="work", state="running", concurrency_key="ta") for n in (1, 2)]
    before = rows([two[0], make_task(2, kind="work", concurrency_key="ta")], [limited])
    assert flow_violations(before, rows(two, [limited]), set()) == [
        "kind work key ta (keyConcurrency 1): 2 running, 1 before"
    ]
