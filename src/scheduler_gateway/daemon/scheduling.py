"""Scheduling in the daemon: the one place that wires the scheduler into a ``Gateway``.

It builds the ``SchedulePolicy`` from ``[scheduler]``, the service on the gateway's own store (which is
also the ``ScheduleStore``), the launcher on the gateway's own ``TaskService`` (an occurrence is an
ordinary task, no second execution stack), the poller actor, and hooks them in: the completion listener
on every committed task transition, the thread check on task creation, the requeue guard on a retry of a
schedule's task (its run becomes active again), the HTTP routes on the admin app.
``Gateway`` only constructs it and starts/stops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from scheduler_gateway.actors.scheduler import Scheduler, SchedulerSettings, ScheduleService, TaskServiceLauncher
from scheduler_gateway.actors.scheduling.requeue import RunReopen
from scheduler_gateway.actors.task_service import TaskService
from scheduler_gateway.daemon.http.app import AdminApi
from scheduler_gateway.daemon.http.schedules import schedule_routes
from scheduler_gateway.daemon.metrics import PrometheusMetrics, PrometheusScheduleMetrics
from scheduler_gateway.daemon.store.select import Store


class Scheduling:
    def __init__(
        self,
        settings: SchedulerSettings,
        store: Store,
        tasks: TaskService,
        api: AdminApi,
        metrics: PrometheusMetrics,
        http_extensions: list[Callable[[web.Application], None]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = PrometheusScheduleMetrics(metrics.registry)
        self.launcher = TaskServiceLauncher(tasks, store, store)
        self.service = ScheduleService(
            store,
            self.launcher,
            settings.policy(),
            clock,
            metrics=self.metrics,
            dispatch_concurrency=settings.dispatch_concurrency,
        )
        self.actor = Scheduler(self.service, clock, settings.poll_interval_s, metrics=self.metrics)
        tasks.add_listener(self.actor.on_transition)
        tasks.set_thread_check(self.service.check_thread)
        tasks.set_requeue_guard(RunReopen(store))  # a schedule's task retried gets its run back (CONTRACT 2.7)
        http_extensions.append(schedule_routes(api.bodies, self.service))

    async def start(self) -> None:
        await self.actor.start()

    async def stop(self) -> None:
        await self.actor.stop()
