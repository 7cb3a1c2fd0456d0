"""The dispatcher: keeps a bounded window of unclaimed offers per kind on GW_DISPATCH.

It learns every change of a queued or running task from the task service (``update``), and offers the
due, queued tasks of each kind by priority then age, at most ``max_offers_per_kind`` unclaimed at a
time, so a high-priority task never waits behind a deep backlog already in the stream. Threads are
serial lanes: only the oldest queued task of a thread is offered, and only while no task of that thread
is offered or running. A canceled or re-attempted task frees its slot at once; its stale offer, if one
is still in the stream, is refused at claim.

Flow control (docs/FLOW.md, actors/dispatch_flow.py): the ready tasks of a kind wait in one queue per
``concurrencyKey``, and the keys take turns for each offer; a task is offered only when one more start would
break none of its kind's rules (pause, concurrency, key concurrency, rates), the offers already out counted as
starts to come. A key whose own limit binds sits out its turns until a slot of that key frees; a kind-wide
limit holds the whole kind until a slot frees or a start leaves a rate's window (a timer).

An offer JetStream acked is not proof that a node will ever see it: a fault of the cluster (a stream or consumer
leader elected again while the offer was stored or delivered) may lose it, and every other path that offers the
attempt again (another instance's dispatcher, the leader's re-read at a takeover or when an instance is gone, a
publish retried) uses the same ``Nats-Msg-Id``, which JetStream drops as a duplicate for 120 s after the first. So
an offer still unclaimed ``reoffer_after_s`` after its publish (twice the offers' AckWait: a delivery to a node
that died is redelivered first) is published again under ``<attemptId>.<n>``, the n-th re-offer of that attempt,
and the wait doubles each time up to ``REOFFER_MAX_S``. A copy of an offer that is still in the stream is
harmless: a claim of the attempt is granted once, and refused (the copy acked) once the attempt runs or ended.

With several instances a claim of this dispatcher's offer may be answered by another instance, and this one
learns of it only from the store (actors/shared_tasks.py, ``LiveSync``): until then the claimed task holds a
place in its window. ``crowded_offers`` names the offers of the kinds whose window is full while ready tasks
wait behind it, which ``LiveSync`` checks against the store soon after, so a window never waits for the
next full sync to take its next tasks.
"""

from __future__ import annotations

import functools
import heapq
import logging
from collections import Counter
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.messages import Offer

from .bus_ports import Bus, Metrics, NullMetrics
from .dispatch_flow import FlowBook, Key, KindQueue
from .dispatch_lanes import ThreadLanes
from .dispatch_reoffers import REOFFER_AFTER_S, ReofferBook
from .dispatch_workflows import WorkflowHold
from .kind_trouble import KindTrouble, KindUnavailable
from .model.flow import KindSettings
from .model.records import Task
from .runtime import LoopActor, Wakeup

log = logging.getLogger(__name__)

#: how long a task refused for a pause this dispatcher has yet to learn waits before it is judged again: every
#: instance reads the kinds' settings every second (actors/kinds.py)
PAUSE_SEEN_S = 1.0


class Dispatcher(LoopActor):
    name = "dispatcher"

    def __init__(
        self,
        bus: Bus,
        clock: Callable[[], float],
        max_offers_per_kind: int = 64,
        metrics: Metrics | None = None,
        reoffer_after_s: float = REOFFER_AFTER_S,
    ) -> None:
        super().__init__()
        self._bus = bus
        self._clock = clock
        self._max = max_offers_per_kind
        self._metrics = metrics or NullMetrics()
        self._queued: dict[str, Task] = {}
        self._ready: dict[str, KindQueue] = {}
        self.flow = FlowBook()
        self._flow_timers: set[tuple[float, str]] = set()
        self._timers: list[tuple[float, str, str]] = []
        self._offered: dict[str, dict[str, str]] = {}  # kind -> task id -> attempt id
        self._offered_kind: dict[str, str] = {}  # task id -> kind
        self._offered_key: dict[str, Key] = {}  # task id -> concurrency key, of the offered tasks
        self._lanes = ThreadLanes()
        self._reoffers = ReofferBook(reoffer_after_s)  # when an unclaimed offer goes out again, and as what
        self._wake = Wakeup()
        self._encoder = msgspec.json.Encoder()
        self.trouble = KindTrouble()  # the kinds whose offers cannot be published now, each held back alone
        #: the kinds whose window was full at the last pick while ready tasks waited behind it
        self._crowded: set[str] = set()
        #: told when a kind's window is found full with tasks waiting (several instances: ``LiveSync.soon``)
        self.on_crowded: Callable[[], None] | None = None
        #: workflows' maxParallel (actors/dispatch_workflows.py); a task waiting for its dependencies is never offered
        self._workflows = WorkflowHold()

    # -- what the task service tells us -------------------------------------------------------------
    def update(self, task: Task, *, offered_elsewhere: bool = False) -> None:
        """A task was created or changed (after its commit); ``offered_elsewhere``: another instance's to offer."""
        # a claim moves a task from its offer to its run: its workflow's slot stays taken (``_count``)
        self._unoffer(
            task.id, keep_attempt=task.attempt_id if task.state == "queued" else None, free=task.state != "running"
        )
        self._reoffers.forget_stale(task)
        self._count(task)
        queued = task.state == "queued" and not offered_elsewhere
        if queued and task.waiting_deps:
            self._queued[task.id] = task  # known (waitingFor "dependencies"), never offered until released
            if task.thread_id:
                self._lanes.remove(task)
        elif queued:
            self._queued[task.id] = task
            if task.thread_id:
                self._lanes.add(task)
            self._schedule(task)
        else:
            if self._queued.pop(task.id, None) is not None:
                self._forget_if_drained(task.kind)
            if task.thread_id:
                if task.state == "running":
                    self._lanes.add(task)
                    self._lanes.activate(task)
                else:
                    self._lanes.remove(task)
        if task.thread_id:
            self._kick_lane(task.thread_id)
        self._wake.set()

    def _count(self, task: Task) -> None:
        """The task's place in the running counts of its kind's flow rules and of its workflow's maxParallel."""
        if task.state == "running":
            self.flow.running(task.id, task.kind, task.concurrency_key, task.started_at)
            self._workflows.take(task)
            return
        freed = self.flow.stopped(task.id)
        if freed is not None and freed[0] in self._ready:
            self._ready[freed[0]].release(freed[1])
        if task.id not in self._offered_kind:
            # a task that ended unoffered may have been given a freed slot of its workflow (put back in line from
            # the held ones, then canceled, or found ended by a later sync): the slot goes to the next held one
            self._unpark(task.id, task.workflow_id if task.terminal else None)

    def set_kind(self, settings: KindSettings) -> None:
        """A kind's flow settings, new or changed (here or on another instance)."""
        self.flow.set(settings)
        if settings.paused:
            self._withdraw(settings.kind)
        queue = self._ready.get(settings.kind)
        if queue is not None:
            queue.release_all()  # each key is judged again by the new rules at its next turn
        self._wake.set()

    def _withdraw(self, kind: str) -> None:
        """A pause: the kind's offers out are no longer counted as on offer, and each task's next offer is a fresh
        copy (the next ``Nats-Msg-Id``), so a resume starts them at once wherever their copies are (parked by a
        node after a refused claim, on this instance or another). A copy claimed meanwhile is refused LIMITED; one
        claimed after the fresh copy ran is stale (acked)."""
        for task_id, attempt_id in list(self._offered.get(kind, {}).items()):
            task = self._queued.get(task_id)
            self._unoffer(task_id, keep_attempt=None)
            if task is None or task.attempt_id != attempt_id:
                continue
            self._reoffers.bump(task)
            if task.thread_id and self._lanes.deactivate(task.thread_id, task_id):
                self._kick_lane(task.thread_id)
            else:
                self._schedule(task)

    def waiting_for(self, task: Task) -> str | None:
        """Why a task that is not running has not started (the task's ``waitingFor``), as far as this instance
        sees; None for running and terminal tasks and for one on offer."""
        if task.state == "waiting_approval":
            return "approval"
        if task.state != "queued" or task.id in self._offered_kind:
            return None
        return self._held_by(task, self._clock(), self._flow_rule)

    def _unpark(self, task_id: str, ended_in: str | None = None) -> None:
        """A workflow's task left its offer or its run: the parked tasks of its workflow that take the slot."""
        for parked_id in self._workflows.drop(task_id, self._parked_ready, self._parked_startable, ended_in):
            self._schedule(self._queued[parked_id])

    def _parked_ready(self, task_id: str) -> bool:
        task = self._queued.get(task_id)
        return task is not None and not task.waiting_deps and task_id not in self._offered_kind

    def _parked_startable(self, task_id: str) -> bool:
        """A parked task that may be offered now by its own rules (its kind not paused nor at a limit, its time
        come, its lane free): only such a task takes a freed slot of its workflow."""
        task = self._queued[task_id]
        now = self._clock()
        if task.not_before > now or not self._lanes.allows(task):
            return False
        return self._flow_rule(task.kind, task.concurrency_key, now) is None

    def flow_figures(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """(kind, state) -> queued / running tasks, and (kind, reason) -> queued tasks held back (metrics)."""
        tasks: Counter[tuple[str, str]] = Counter()
        held: Counter[tuple[str, str]] = Counter()
        now = self._clock()
        rules = functools.cache(self._flow_rule)  # one answer per key: the same for all its tasks
        for t in self._queued.values():
            tasks[(t.kind, "queued")] += 1
            reason = None if t.id in self._offered_kind else self._held_by(t, now, rules)
            if reason is not None:
                held[(t.kind, reason)] += 1
        for kind, n in self.flow.running_kind.items():
            if n:
                tasks[(kind, "running")] = n
        return dict(tasks), dict(held)

    def _held_by(self, task: Task, now: float, flow_rule: Callable[[str, Key, float], str | None]) -> str | None:
        """What holds an unoffered queued task: its dependencies, its own time, its thread, its workflow's
        maxParallel, then its kind's flow rules."""
        if task.waiting_deps:
            return "dependencies"
        if task.not_before > now:
            return "retry_backoff" if task.attempt_no > 1 else "not_before"
        if task.thread_id and not self._lanes.allows(task):
            return "thread"
        if self._workflows.full(task):
            return "workflow_parallel"
        return flow_rule(task.kind, task.concurrency_key, now)

    def _flow_rule(self, kind: str, key: Key, now: float) -> str | None:
        """The rule one more start of (kind, key) would break, counting the offers out as starts to come."""
        offered = self._offered.get(kind, {})
        same_key = sum(1 for tid in offered if self._offered_key.get(tid) == key) if key is not None else 0
        return self.flow.rule(kind, key, now, len(offered), same_key)

    def claim_refused(self, task: Task, *, park: bool = True, paused: bool = False) -> bool:
        """The store refused a claim of this offer (a flow limit, or the thread's lane). True when this dispatcher
        agrees: by its own view the task's flow rules hold it back now (an offer published before a pause or a
        lowered limit). Then the task goes back to wait by the rules, neither counted as on offer nor offered
        again while they bind, and its next offer is a fresh copy under the next ``Nats-Msg-Id`` (the refused
        copy stays in the stream, its node naks it for long, and JetStream would drop a repeat of the id as a
        duplicate): a resume or a freed slot starts it at once.

        False otherwise: a task of another instance's, a thread's lane, or a view that lags the store (another
        instance's starts not seen yet). Then the refused copy is how the task comes back, soon: the task stays
        on offer here (a thread's lane is judged again, as the head may have changed). ``park=False`` (several
        instances, under a limit: a view may lag the store either way): never parked, judged as before.
        ``paused``: the store refused it because the kind is paused; a view that does not know it yet (paused on
        another instance) learns it within a second, so the task waits that long before it is judged again."""
        live = self._queued.get(task.id)
        if park and live is not None and live.attempt_id == task.attempt_id and not task.thread_id:
            lags = self._rule_without(live) is None
            if lags and not paused:
                return False  # this view would offer it now: the store knows more; the refused copy comes back soon
            if self._offered.get(task.kind, {}).get(task.id) == task.attempt_id:
                self._reoffers.bump(task)
                self._unoffer(task.id, keep_attempt=None)
                if lags:  # a pause this view has yet to learn (within a second): judged again after that
                    heapq.heappush(self._timers, (self._clock() + PAUSE_SEEN_S, live.id, live.attempt_id))
                else:
                    self._schedule(live)
                self._wake.set()
            return True  # held by its rules here (again, if a parked copy came back): offered afresh once they allow
        self._unoffer(task.id, keep_attempt=None)
        if task.thread_id and self._lanes.deactivate(task.thread_id, task.id):
            # the lane's head goes back in line, not the refused task: an older task of the thread queued again
            # while this one was on offer (a dead letter retried) is the head now, and the store refused this
            # claim for it; it was skipped while the lane was taken, and nothing else would put it back
            self._kick_lane(task.thread_id)
        elif live is not None:
            self._schedule(live)
        self._wake.set()
        return False

    def _rule_without(self, task: Task) -> str | None:
        """The flow rule one more start of the task would break by this view, its own offer not counted."""
        offered = [tid for tid in self._offered.get(task.kind, {}) if tid != task.id]
        key = task.concurrency_key
        same_key = sum(1 for tid in offered if self._offered_key.get(tid) == key) if key is not None else 0
        return self.flow.rule(task.kind, key, self._clock(), len(offered), same_key)

    def offered_count(self, kind: str) -> int:
        return len(self._offered.get(kind, ()))

    def crowded_offers(self) -> list[str]:
        """The tasks on offer in the kinds whose window is full while ready tasks wait behind it: with several
        instances some of them may have been claimed through another instance (actors/shared_tasks.py)."""
        return [task_id for kind in self._crowded for task_id in self._offered.get(kind, {})]

    def backlog(self) -> int:
        """Queued tasks known to the dispatcher (offered or not)."""
        return len(self._queued)

    # -- internals ---------------------------------------------------------------------------------
    def _unoffer(self, task_id: str, keep_attempt: str | None, free: bool = True) -> None:
        kind = self._offered_kind.get(task_id)
        if kind is None:
            return
        offered = self._offered[kind]
        if keep_attempt is not None and offered.get(task_id) == keep_attempt:
            return  # the same attempt is still on offer
        offered.pop(task_id, None)
        del self._offered_kind[task_id]
        self._reoffers.unwatch(task_id)
        key = self._offered_key.pop(task_id, None)
        queue = self._ready.get(kind)
        if queue is not None:
            queue.release(key)
        if free:
            self._unpark(task_id)

    def _schedule(self, task: Task) -> None:
        if task.not_before > self._clock():
            heapq.heappush(self._timers, (task.not_before, task.id, task.attempt_id))
        else:
            queue = self._ready.get(task.kind)
            if queue is None:
                queue = self._ready[task.kind] = KindQueue()
            queue.push(task.concurrency_key, (-task.priority, task.created_at, task.id, task.attempt_id))

    def _kick_lane(self, thread_id: str) -> None:
        """Put the lane's head back in line when nothing of its thread is offered or running."""
        head_id = self._lanes.idle_head(thread_id)
        head = None if head_id is None else self._queued.get(head_id)
        if head is not None:
            self._schedule(head)

    def _pick(self, now: float) -> list[Task]:
        while self._timers and self._timers[0][0] <= now:
            at, task_id, attempt_id = heapq.heappop(self._timers)
            if not task_id:  # a flow timer: attempt_id names the kind
                self._flow_timers.discard((at, attempt_id))
                if attempt_id in self._ready:
                    self._ready[attempt_id].release_all()
                continue
            task = self._queued.get(task_id)
            if task is not None and task.attempt_id == attempt_id:
                self._schedule(task)
        picked: list[Task] = []
        for kind, queue in self._ready.items():
            if not self.trouble.held(kind, now):
                self._pick_kind(kind, queue, now, picked)
        if self._reoffers.next_at <= now:
            picked += self._unclaimed(now)
        return picked

    def _unclaimed(self, now: float) -> list[Task]:
        """The offered tasks whose offer went unclaimed past its time: each is published again under the next
        ``Nats-Msg-Id`` of its attempt (they keep their place in the window)."""
        again: list[Task] = []
        for task_id in self._reoffers.take_due(now):
            task = self._queued.get(task_id)
            if task is None or self._offered.get(task.kind, {}).get(task_id) != task.attempt_id:
                continue
            self._reoffers.bump(task)
            again.append(task)
        if again:
            self._reoffers.reoffered += len(again)
            waited = self._reoffers.after_s
            log.info("dispatcher: %d offers unclaimed for %.0f s or more; published again", len(again), waited)
        return again

    @property
    def reoffered(self) -> int:
        """Offers published again because they went unclaimed."""
        return self._reoffers.reoffered

    def _pick_kind(self, kind: str, queue: KindQueue, now: float, picked: list[Task]) -> None:
        """Offer the kind's ready tasks, the keys taking turns, while the window and the flow rules allow."""
        offered = self._offered.setdefault(kind, {})
        limited = kind in self.flow.settings and self.flow.settings[kind].limits_starts
        self._crowded.discard(kind)
        while queue.turns and len(offered) < self._max:
            key = queue.take_turn()
            heap = queue.heaps.get(key)
            task = self._best(heap, offered, now) if heap else None
            if heap is None or task is None:
                queue.drop_key(key)
                continue
            if limited:
                rule = self._flow_rule(kind, key, now)
                if rule is not None:
                    heapq.heappush(heap, (-task.priority, task.created_at, task.id, task.attempt_id))
                    if rule in ("kind_rate", "key_rate"):
                        self._wake_at(self.flow.next_free_at(kind, now), kind)
                    if rule.startswith("key_"):
                        queue.hold(key)  # this key sits out its turns; the others go on
                        continue
                    queue.wait_first(key)  # the whole kind waits: a slot frees, or a start leaves a window
                    return
            if heap:
                queue.end_turn(key)
            else:
                queue.drop_key(key)
            offered[task.id] = task.attempt_id
            self._offered_kind[task.id] = kind
            self._offered_key[task.id] = key
            self._workflows.take(task)
            if task.thread_id:
                self._lanes.activate(task)
            picked.append(task)
        if queue.turns:
            self._crowded.add(kind)  # the window is full and tasks wait (a flow rule's wait returned above)
            if self.on_crowded is not None:
                self.on_crowded()

    def _wake_at(self, at: float | None, kind: str) -> None:
        """A timer (an entry with no task) at which the kind's rate-held keys take turns again."""
        if at is not None and (at, kind) not in self._flow_timers:
            self._flow_timers.add((at, kind))
            heapq.heappush(self._timers, (at, "", kind))

    def _best(self, heap: list[tuple[int, float, str, str]], offered: dict[str, str], now: float) -> Task | None:
        """The key's best task that may be offered now; stale entries and tasks that must wait leave the heap."""
        while heap:
            _, _, task_id, attempt_id = heapq.heappop(heap)
            task = self._queued.get(task_id)
            if task is None or task.attempt_id != attempt_id or task_id in offered:
                continue
            if task.not_before > now:
                self._schedule(task)
                continue
            if not self._lanes.allows(task):
                continue  # re-scheduled when the lane frees
            if task.waiting_deps:
                continue  # scheduled when the releaser releases it
            if self._workflows.full(task):
                self._workflows.park(task)  # back in line when a task of its workflow frees a slot
                continue
            return task
        return None

    def _encode(self, task: Task) -> bytes:
        return self._encoder.encode(
            Offer(
                task_id=task.id,
                attempt_id=task.attempt_id,
                attempt_no=task.attempt_no,
                kind=task.kind,
                payload=task.payload,
                run_id=task.run_id,
                thread_id=task.thread_id,
                priority=task.priority,
                lease_seconds=task.lease_s,
                timeout_seconds=task.timeout_s,
                traceparent=task.traceparent,
                concurrency_key=task.concurrency_key,
                workflow_id=task.workflow_id,
                ref=task.ref,
                has_dependencies=bool(task.depends_on) if task.workflow_id is not None else None,
            )
        )

    async def _publish(self, tasks: list[Task]) -> None:
        try:
            msgs = [(t.kind, self._reoffers.msg_id(t), self._encode(t)) for t in tasks]
            results = await self._bus.publish_offers(msgs)
        except Exception as exc:  # NATS away: every offer failed
            results = [exc] * len(tasks)
        now = self._clock()
        by_kind: dict[str, int] = {}
        failed: dict[str, tuple[BaseException, int]] = {}  # kind -> the error that says most, offers failed
        for task, res in zip(tasks, results, strict=True):
            if isinstance(res, BaseException):
                seen = failed.get(task.kind)
                error = res if seen is None or isinstance(res, KindUnavailable) else seen[0]
                failed[task.kind] = (error, (seen[1] if seen else 0) + 1)
                self._unoffer(task.id, keep_attempt=None)
                if task.thread_id:
                    self._lanes.deactivate(task.thread_id, task.id)
                if self._queued.get(task.id) is task:
                    self._schedule(task)
            else:
                if self._offered.get(task.kind, {}).get(task.id) == task.attempt_id:
                    self._reoffers.published(task, now)  # (not when claimed, canceled or re-attempted meanwhile)
                by_kind[task.kind] = by_kind.get(task.kind, 0) + 1
        for kind, n in by_kind.items():
            self._metrics.offers_published(kind, n)
            if kind not in failed:
                self.trouble.published(kind)
        # a failing kind waits alone (actors/kind_trouble.py): the other kinds' offers go on at once
        for kind, (error, n) in failed.items():
            self.trouble.failed(kind, error, n, now)

    def failing_kinds(self) -> dict[str, str]:
        """kind -> why its offers cannot be published now (``/readyz``)."""
        return self.trouble.failing()

    def _forget_if_drained(self, kind: str) -> None:
        """A failing kind with no queued task left (canceled, say) is no longer reported."""
        if self.trouble.is_failing(kind) and not any(t.kind == kind for t in self._queued.values()):
            self.trouble.forget(kind)
            self._ready.pop(kind, None)  # only stale entries left: they would bring the kind back

    async def run(self) -> None:
        while True:
            now = self._clock()
            picked = self._pick(now)
            if picked:
                await self._publish(picked)
                continue
            due = min(
                self._timers[0][0] if self._timers else float("inf"), self._reoffers.next_at, self.trouble.next_retry()
            )
            await self._wake.wait(due - now if due != float("inf") else None)
