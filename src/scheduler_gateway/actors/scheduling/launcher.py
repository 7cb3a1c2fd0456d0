"""The launcher: an occurrence becomes an ordinary gateway task through ``TaskService.create``."""

from __future__ import annotations

import asyncio
import logging

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError

from ..model.records import Task
from ..model.schedule import RunError, ScheduledRun, ScheduledTask
from ..schedule_ports import DuplicateOccurrence, LaunchedTask, LaunchFailed, ScheduleStore, ThreadBusy
from ..store_ports import TaskReads
from ..tasks import RUN_LABEL, SCHEDULE_LABEL, Caller, NewTask, TaskService

log = logging.getLogger(__name__)

#: The Idempotency-Key of a run's task (scoped to the schedule's owner, like a user's own keys)
RUN_KEY_PREFIX = "gw.run."


class TaskServiceLauncher:
    """``RunLauncher`` on the gateway's own task lifecycle: an occurrence is ``TaskService.create`` with the
    schedule's template, as the schedule's owner (actor type ``system``, request id = the run's id, so the
    task's history and audit name the run), in the resolved thread."""

    def __init__(self, tasks: TaskService, task_store: TaskReads, store: ScheduleStore) -> None:
        self._tasks = tasks
        self._task_store = task_store
        self._store = store

    async def launch(self, task: ScheduledTask, run: ScheduledRun, thread_id: str) -> str:
        try:
            if task.context_mode == "reuse_thread":
                thread = await self._store.get_thread(thread_id)
                if thread is None or thread.owner != task.owner:
                    raise LaunchFailed(f"thread {thread_id} no longer exists", details={"threadId": thread_id})
                if await self._store.thread_busy(thread_id):
                    raise ThreadBusy(
                        f"thread {thread_id} has a queued or running task", details={"threadId": thread_id}
                    )
            t = task.template
            spec = NewTask(
                kind=t.kind,
                payload=t.payload,
                priority=t.priority,
                max_attempts=t.max_attempts,
                lease_s=t.lease_s,
                timeout_s=t.timeout_s,
                concurrency_key=t.concurrency_key,
                unique_key=t.unique_key,
                unique_for_s=t.unique_for_s if t.unique_key is not None else None,
                thread_id=thread_id,
                labels={SCHEDULE_LABEL: task.id, RUN_LABEL: run.id},
            )
            caller = Caller(task.owner, "user", run.id, "system")
            # once per run, whoever launches it: a holder paused past its claim and the one that took the claim
            # over may both get here; the second create answers the first one's task
            created, _ = await self._tasks.create(caller, spec, RUN_KEY_PREFIX + run.id, run.id)
            return created.id
        except (ThreadBusy, LaunchFailed):
            raise
        except Conflict as exc:
            if exc.code != Code.DUPLICATE_TASK:
                raise LaunchFailed(f"the task could not be created: {exc.message}", details={"code": exc.code}) from exc
            raise DuplicateOccurrence(exc.message, details=exc.details) from None
        except asyncio.CancelledError:
            raise  # shutting down is control flow, not a launch result
        except GatewayError as exc:
            raise LaunchFailed(f"the task could not be created: {exc.message}", details={"code": exc.code}) from exc
        except Exception as exc:
            # the port allows two errors out; anything else is a failed launch, logged with its stack here
            log.exception("launch of run %s failed", run.id)
            raise LaunchFailed(f"the task could not be created ({type(exc).__name__})") from exc

    async def find(self, run: ScheduledRun) -> LaunchedTask | None:
        """The run's task: by id once the run learned it; before that (a crash between the task's creation
        and the run's update) among the tasks of the run's thread, by the ``scheduledRunId`` label. The
        thread, not an Idempotency-Key, so a launch costs no extra read (a key is looked up on every create)."""
        task: Task | None = None
        if run.task_id is not None:
            task = await self._task_store.get_task(run.task_id)
        elif run.thread_id is not None:
            task = next(
                (
                    t
                    for t in await self._store.tasks_in_thread(run.thread_id)
                    if t.labels.get(RUN_LABEL) == run.id and t.labels.get(SCHEDULE_LABEL) == run.scheduled_task_id
                ),
                None,
            )
        if task is None or task.owner != run.owner:
            return None  # a task of another owner is never a schedule's occurrence
        err = RunError(task.error.code, task.error.message) if task.error is not None else None
        return LaunchedTask(task.id, task.state, err, task.finished_at if task.terminal else None)
