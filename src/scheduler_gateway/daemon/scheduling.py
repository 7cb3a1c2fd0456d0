"""Scheduling in the daemon: the scheduler's parts built for a ``Gateway``, and what it plugs into the gateway.

It builds the ``SchedulePolicy`` from ``[scheduler]``, the service on the gateway's own store (which is
also the ``ScheduleStore``), the launcher on the gateway's own ``TaskService`` (an occurrence is an
ordinary task, no second execution stack) and the poller actor. What the scheduler adds to the rest is
declared here and connected by the composition root (``Gateway``), in one place with every other part's:
the completion listener on every committed task transition (``actor.on_transition``), the thread check on
task creation (``service.check_thread``), the requeue guard on a retry of a schedule's task (its run becomes
active again: ``requeue_guard``), the HTTP routes (``routes``). Constructing it changes nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from scheduler_gateway.actors.scheduling import Scheduler, SchedulerSettings, ScheduleService, TaskServiceLauncher
from scheduler_gateway.actors.scheduling.requeue import RunReopen
from scheduler_gateway.actors.tasks import TaskService
from scheduler_gateway.daemon.http.requests import Bodies
from scheduler_gateway.daemon.http.schedules import schedule_routes
from scheduler_gateway.daemon.metrics import PrometheusMetrics, PrometheusScheduleMetrics
from scheduler_gateway.daemon.store.select import Store


class Scheduling:
    def __init__(
        self,
        settings: SchedulerSettings,
        store: Store,
        tasks: TaskService,
        metrics: PrometheusMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = PrometheusScheduleMetrics(metrics.registry)
        self.launcher = TaskServiceLauncher(tasks, store.tasks, store.schedules)
        self.service = ScheduleService(
            store.schedules,
            self.launcher,
            settings.policy(),
            clock,
            metrics=self.metrics,
            dispatch_concurrency=settings.dispatch_concurrency,
        )
        self.actor = Scheduler(self.service, clock, settings.poll_interval_s, metrics=self.metrics)
        #: a schedule's task retried gets its run back (CONTRACT 2.7)
        self.requeue_guard = RunReopen(store.schedules)

    def routes(self, bodies: Bodies) -> Callable[[web.Application], None]:
        """The schedules' and threads' routes, for the admin app's route groups."""
        return schedule_routes(bodies, self.service)

    async def start(self) -> None:
        await self.actor.start()

    async def stop(self) -> None:
        await self.actor.stop()
