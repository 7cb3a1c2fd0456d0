"""The node protocol: claim, heartbeat and settle, and the lease clock's expiry and timeout."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError
from scheduler_gateway.wire.messages import (
    ClaimReply,
    ClaimRequest,
    ExtendedLease,
    HeartbeatReply,
    HeartbeatRequest,
    RevokedLease,
    Settle,
    WireError,
)
from scheduler_gateway.wire.timefmt import fmt_ts
from scheduler_gateway.wire.workflows import DependencyView

from .. import failpoints, idgen
from ..bus_ports import Metrics, WaitingSettles
from ..dispatcher import Dispatcher
from ..model import task_machine as sm
from ..model.records import ActorRef, Task, TaskError
from ..model.retry_policy import backoff_s
from ..nodes import NodeRegistry
from ..store_ports import TaskServiceStore
from .api import SettleOutcome, body_digest
from .dead_letters import DeadLetters
from .ledger import TaskLedger
from .waiting_settles import CANNOT_TELL, SettleBacklog

log = logging.getLogger(__name__)

#: a LIMITED claim's ``retryAfterSeconds`` where the refused copy is parked: the node naks the offer with this
#: delay, and the gateway offers the task again itself (a fresh copy) as soon as its rules allow, or the kind is
#: paused; held-back work then costs no claim per second
LIMITED_RETRY_AFTER_S = 30.0
#: ... and where the refused copy is how the task comes back (another instance's offer; a limit with several
#: instances, whose views lag the store): soon, as every LIMITED offer came back before
LIMITED_RETRY_SOON_S = 1.0
#: attempts whose LIMITED refusal is audited already, kept to audit one row per attempt and limit, not per repeat
LIMITED_SEEN_MAX = 10_000

#: what builds a claim batch's inline dependencies (actors/workflows/inline.py): given the granted tasks, the views
#: by task id of those that fit (the others read theirs by pages)
InlineHook = Callable[[list[Task]], Awaitable[dict[str, list[DependencyView]]]]


class NodeProtocol:
    """What nodes send about their leases (claims, heartbeats, settles) and what the lease clock finds."""

    def __init__(
        self,
        ledger: TaskLedger,
        store: TaskServiceStore,
        nodes: NodeRegistry,
        dispatcher: Dispatcher,
        dead_letters: DeadLetters,
        metrics: Metrics,
        clock: Callable[[], float],
        rng: random.Random,
        waiting_settles: WaitingSettles | None = None,
    ) -> None:
        self._ledger = ledger
        self._backlog = None if waiting_settles is None else SettleBacklog(waiting_settles, clock)
        self._store = store
        self._nodes = nodes
        self._dispatcher = dispatcher
        self._limited_seen: OrderedDict[tuple[str, str], None] = OrderedDict()  # (attempt id, rule), oldest first
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._clock = clock
        self._rng = rng
        #: set when the gateway serves workflows: a granted claim of a task with parents carries them when they fit
        self.inline: InlineHook | None = None

    def _delay(self, task: Task) -> float:
        return backoff_s(task.retry_backoff_s, task.attempts_in_budget, self._rng.uniform(-1.0, 1.0))

    async def claim(self, node_id: str, req: ClaimRequest) -> ClaimReply:
        if self._nodes.is_draining(node_id):
            task = await self._ledger.current(req.task_id)
            await self._ledger.refused(
                "claim",
                task,
                req.task_id,
                ActorRef("node", node_id),
                error_code=Code.NODE_DRAINING,
                node_id=node_id,
                attempt_id=req.attempt_id,
            )
            return _claim_error(Code.NODE_DRAINING, f"node {node_id} is draining")
        granted: dict[str, Task] = {}
        reply = await self._ledger.serial(req.task_id, lambda: self._claim(node_id, req, granted))
        if not granted:
            return reply
        answered = await self._with_dependencies([req], [reply], granted)
        return answered[0] if isinstance(answered[0], ClaimReply) else reply

    def claim_many(self, node_id: str, reqs: list[ClaimRequest]) -> list[asyncio.Future[ClaimReply]]:
        """Each claim of a batch queued in its task's mailbox now. Through ``claim`` each cost a task and three
        coroutine frames before it reached its mailbox, and a turn of the busy loop per frame: the claim round trip
        sets how fast a node's slots turn over (docs/PERFORMANCE.md)."""
        if self._nodes.is_draining(node_id):
            return [asyncio.ensure_future(self.claim(node_id, req)) for req in reqs]
        granted: dict[str, Task] = {}
        futs = [self._ledger.queued(req.task_id, functools.partial(self._claim, node_id, req, granted)) for req in reqs]
        if self.inline is None or not any(self._may_inline(req.task_id) for req in reqs):
            return futs
        # the batch's inline dependencies are read once every claim is answered: one read for the batch
        outs: list[asyncio.Future[ClaimReply]] = [asyncio.get_running_loop().create_future() for _ in reqs]
        whole = asyncio.ensure_future(self._batch_with_dependencies(reqs, futs, granted))
        whole.add_done_callback(functools.partial(_hand_out, outs))
        return outs

    def _may_inline(self, task_id: str) -> bool:
        """Whether the claim of ``task_id`` may carry dependencies: its live copy has parents, or there is none (a
        batch of tasks without parents costs nothing more)."""
        task = self._ledger.live.get(task_id)
        return task is None or bool(task.depends_on)

    async def _batch_with_dependencies(
        self, reqs: list[ClaimRequest], futs: list[asyncio.Future[ClaimReply]], granted: dict[str, Task]
    ) -> list[ClaimReply | BaseException]:
        outcomes: list[ClaimReply | BaseException] = list(await asyncio.gather(*futs, return_exceptions=True))
        return await self._with_dependencies(reqs, outcomes, granted) if granted else outcomes

    async def _with_dependencies(
        self, reqs: list[ClaimRequest], outcomes: list[ClaimReply | BaseException], granted: dict[str, Task]
    ) -> list[ClaimReply | BaseException]:
        """The granted replies with their tasks' parents inline where they fit (docs/WIRE.md, Claim). A failed
        read leaves them out: the node reads them by pages, as without them."""
        if self.inline is None:
            return outcomes
        try:
            found = await self.inline(list(granted.values()))
        except Exception:
            log.warning("a claim's inline dependencies could not be read; the node reads them by pages", exc_info=True)
            return outcomes
        return [
            msgspec.structs.replace(o, dependencies=found[r.task_id])
            if isinstance(o, ClaimReply) and o.ok and r.task_id in found
            else o
            for r, o in zip(reqs, outcomes, strict=True)
        ]

    async def _claim(self, node_id: str, req: ClaimRequest, granted: dict[str, Task] | None = None) -> ClaimReply:
        task = await self._ledger.current(req.task_id)
        actor = ActorRef("node", node_id)
        if task is None:
            await self._ledger.refused(
                "claim",
                None,
                req.task_id,
                actor,
                error_code=Code.TASK_NOT_FOUND,
                node_id=node_id,
                attempt_id=req.attempt_id,
            )
            return _claim_error(Code.TASK_NOT_FOUND, f"task {req.task_id} not found")
        now = self._clock()
        try:
            result = sm.claim(task, req.attempt_id, node_id, idgen.new_id("lse"), now, process_id=req.process_id)
        except GatewayError as exc:
            await self._ledger.refused(
                "claim",
                task,
                task.id,
                actor,
                error_code=exc.code,
                node_id=node_id,
                attempt_id=req.attempt_id,
            )
            return _claim_error(exc.code, exc.message)
        if isinstance(result, sm.Repeat):
            await self._ledger.repeated("claim", task, task.id, actor, node_id=node_id)
            if granted is not None and task.depends_on:
                granted[task.id] = task
            return _lease_reply(task)
        try:
            new = await self._ledger.commit(result, None)
        except Conflict as exc:
            return await self._refused_by_store(task, req, node_id, actor, exc)
        failpoints.hit("claim.after_commit")  # the task is running in the store; the node has no reply yet
        if new.thread_id is not None:
            failpoints.hit("claim.after_thread_commit")  # the thread's lane is taken; the node has no reply yet
        self._metrics.queue_latency(new.kind, max(0.0, now - task.not_before))
        if granted is not None and new.depends_on:
            granted[new.id] = new
        return _lease_reply(new)

    async def _wait_again(self, task: Task) -> None:
        """A released task whose counters do not hold waits again, so it is not offered again and again until
        the releaser gets to it (a release decided on counters read before a parent reopened, committed after
        the hold: neither moves the revision). Its recheck has the releaser decide it (a skip, if doomed)."""
        held = sm.dependencies_reopened(task, idgen.new_id("att"), self._clock())
        if not isinstance(held, sm.Transition):
            return
        try:
            await self._ledger.commit(held, None)
        except GatewayError as exc:  # the task moved since (a stale copy): the releaser's notice decides it
            log.info("task %s: not held again after a refused claim (%s)", task.id, exc.code)

    async def _refused_by_store(
        self, task: Task, req: ClaimRequest, node_id: str, actor: ActorRef, exc: Conflict
    ) -> ClaimReply:
        """The answer to a claim the store refused at commit (its guards: dependencies, a thread's lane, a flow
        limit); any other conflict is raised."""
        if exc.code == Code.NOT_DUE:
            # the store's guard: a workflow task's dependencies do not hold there (a parent reopened since its
            # release). Refused and audited like the machine's own NOT_DUE
            await self._ledger.refused(
                "claim", task, task.id, actor, error_code=exc.code, node_id=node_id, attempt_id=req.attempt_id
            )
            await self._wait_again(task)
            return _claim_error(exc.code, exc.message)
        if exc.code == Code.THREAD_BUSY:
            # the store holds the lane: another task of the thread runs (an offer from before a restart, another
            # instance's). The node naks the offer; it is claimed once the lane is free.
            details: dict[str, Any] = {"threadId": task.thread_id, "rule": "thread"}
            message = f"thread {task.thread_id} already has a running task"
        elif exc.code == Code.LIMITED:
            # a flow limit of the kind binds where the claim commits (a stale offer, another instance's claim):
            # the task stays queued and the node naks the offer (docs/FLOW.md)
            details = {k: v for k, v in exc.details.items() if k != "taskId"}
            message = exc.message
            self._metrics.claim_limited(task.kind, str(exc.details.get("rule", "")))
        else:
            raise exc
        if self._first_limited(req.attempt_id, str(details.get("rule", ""))):
            await self._ledger.refused(
                "claim", task, task.id, actor, error_code=Code.LIMITED, node_id=node_id,
                attempt_id=req.attempt_id, details=details,
            )  # fmt: skip
        else:  # the same attempt held back by the same rule again: counted, not audited once more
            self._metrics.refused("claim", Code.LIMITED)
        paused = details.get("rule") == "kind_paused"
        # one instance: its dispatcher's view of the limits is the store's, so it may park the refused copy
        # and offer afresh when they allow. Several: a view may lag the store either way (another instance's
        # starts and ends come a second late), so only a pause parks it (a pause is long by nature, and every
        # view learns it within a second); under a limit the refused copy comes back soon, as it always did
        parked = self._dispatcher.claim_refused(task, park=self._ledger.shared is None or paused, paused=paused)
        long_wait = parked or paused
        return ClaimReply(
            ok=False,
            error=WireError(code=Code.LIMITED, message=message),
            retry_after_seconds=LIMITED_RETRY_AFTER_S if long_wait else LIMITED_RETRY_SOON_S,
        )

    def _first_limited(self, attempt_id: str, rule: str) -> bool:
        """True the first time this attempt is refused LIMITED by this rule (as far as this instance remembers)."""
        key = (attempt_id, rule)
        if key in self._limited_seen:
            self._limited_seen.move_to_end(key)
            return False
        self._limited_seen[key] = None
        if len(self._limited_seen) > LIMITED_SEEN_MAX:
            self._limited_seen.popitem(last=False)
        return True

    async def heartbeat(self, node_id: str, req: HeartbeatRequest) -> HeartbeatReply:
        now = self._clock()
        self._nodes.heartbeat(node_id, req, now)
        extended: list[ExtendedLease] = []
        revoked: list[RevokedLease] = []
        extensions: list[tuple[Task, Task]] = []  # several instances: (read, extended), persisted together below
        stored_now: dict[str, Task] = {}
        if self._ledger.shared is not None and req.leases:
            stored_now = {t.id: t for t in await self._ledger.shared.get_tasks([lease.task_id for lease in req.leases])}
        for lease in req.leases:
            task = (
                self._ledger.live.get(lease.task_id) if self._ledger.shared is None else stored_now.get(lease.task_id)
            )
            try:
                if task is None:
                    stored = await self._store.tasks.get_task(lease.task_id)
                    if stored is None:
                        raise Conflict("unknown task", code=Code.LEASE_NOT_FOUND)
                    task = stored
                new = sm.extend_lease(task, lease.lease_id, node_id, now)
            except GatewayError as exc:
                reason = task.state if task is not None and task.terminal else exc.code
                revoked.append(RevokedLease(task_id=lease.task_id, lease_id=lease.lease_id, reason=reason))
                if exc.code == Code.FORBIDDEN:  # a node naming another node's lease: forged, keep a record
                    await self._ledger.refused(
                        "heartbeat",
                        task,
                        lease.task_id,
                        ActorRef("node", node_id),
                        error_code=exc.code,
                        node_id=node_id,
                        details={"leaseId": lease.lease_id},
                    )
                continue
            if self._ledger.shared is not None:
                extensions.append((task, new))
                continue
            # a heartbeat does not go through the mailbox: it touches only the live lease expiry, and a
            # racing transition simply replaces the live task (the clock re-checks against it)
            if self._ledger.live.get(task.id) is task:
                self._ledger.live[task.id] = new
                self._ledger.lease_clock.extend(task.id, lease.lease_id, new.lease_expires_at or now)
            extended.append(
                ExtendedLease(
                    task_id=task.id, lease_id=lease.lease_id, lease_expires_at=fmt_ts(new.lease_expires_at) or ""
                )
            )
        if extensions:
            await self._ledger.persist_extensions(extensions, now, extended, revoked)
        return HeartbeatReply(
            extended=extended, revoked=revoked, draining=self._nodes.is_draining(node_id), settle_batches=True
        )

    async def settle(self, node_id: str, msg: Settle) -> SettleOutcome:
        return await self._ledger.serial(msg.task_id, lambda: self._settle(node_id, msg))

    async def _settle(self, node_id: str, msg: Settle) -> SettleOutcome:
        actor = ActorRef("node", node_id)
        task = await self._ledger.current(msg.task_id)
        if task is None:
            await self._ledger.refused(
                "settle",
                None,
                msg.task_id,
                actor,
                error_code=Code.LEASE_NOT_FOUND,
                node_id=node_id,
                attempt_id=msg.attempt_id,
                details={"leaseId": msg.lease_id},
            )
            return SettleOutcome("refused", Code.LEASE_NOT_FOUND)
        now = self._clock()
        result_bytes = bytes(msg.result)
        err = TaskError(msg.error.code, msg.error.message) if msg.error else None
        kwargs: dict[str, Any] = dict(
            node_id=node_id,
            lease_id=msg.lease_id,
            attempt_id=msg.attempt_id,
            outcome=msg.outcome,
            result=msg.result,
            digest=body_digest(result_bytes)[:32],
            error=err,
            retryable=bool(msg.error and msg.error.retryable),
            new_attempt_id=idgen.new_id("att"),
            delay_s=self._delay(task),
            now=now,
        )
        try:
            try:
                result = sm.settle(task, lease_known=False, **kwargs)
            except Conflict as exc:
                if exc.code != Code.LEASE_NOT_FOUND or not await self._store.tasks.lease_seen(task.id, msg.lease_id):
                    raise
                result = sm.settle(task, lease_known=True, **kwargs)
        except GatewayError as exc:
            await self._ledger.refused(
                "settle",
                task,
                task.id,
                actor,
                error_code=exc.code,
                node_id=node_id,
                attempt_id=msg.attempt_id,
                details={"leaseId": msg.lease_id, "outcome": msg.outcome},
            )
            return SettleOutcome("refused", exc.code)
        if isinstance(result, sm.Repeat):
            await self._ledger.repeated(
                "settle", task, task.id, actor, node_id=node_id, details={"leaseId": msg.lease_id}
            )
            return SettleOutcome("repeat")
        await self._ledger.commit(result, None, dead_letter=await self._dead_letters.dead_letter_for(result))
        if task.started_at is not None:
            self._metrics.exec_latency(task.kind, msg.outcome, max(0.0, now - task.started_at))
        return SettleOutcome("ok")

    async def lease_expired(self, task_id: str, lease_id: str) -> None:
        async def run() -> None:
            task = (
                self._ledger.live.get(task_id) if self._ledger.shared is None else await self._ledger.current(task_id)
            )
            if task is None or task.state != "running" or task.lease_id != lease_id:
                return
            now = self._clock()
            if task.lease_expires_at is not None and task.lease_expires_at > now:
                self._ledger.lease_clock.extend(task_id, lease_id, task.lease_expires_at)
                return
            if await self._settled_while_waiting(task, lease_id):
                return
            tr = sm.lease_expired(task, lease_id, idgen.new_id("att"), self._delay(task), now)
            await self._ledger.commit(tr, None, dead_letter=await self._dead_letters.dead_letter_for(tr))
            self._metrics.lease_expired(task.kind)

        await self._ledger.serial(task_id, run)

    async def _settled_while_waiting(self, task: Task, lease_id: str) -> bool:
        """Before a deadline fails the attempt: a settle of its lease that waits in GW_SETTLE (stored, acked by no
        gateway: the instance it was delivered to froze or died, and it comes again only after the stream's ack
        wait) is applied now, as its delivery would be; that delivery is then a repeat. Without this, a lease
        shorter than the ack wait runs out while its result waits, and the attempt that succeeded is failed and
        run again. True when the deadline must not fail the attempt now: the settle closed it, or what waits
        cannot be told (``SettleBacklog``; the lease clock calls again every ``recheck_s``)."""
        if self._backlog is None or task.node_id is None:
            return False
        # only the attempt's own settle: one its delivery would refuse is refused (and audited) there, once
        msg = await self._backlog.find(task.node_id, (lease_id, task.id, task.attempt_id))
        if not isinstance(msg, Settle):
            return msg is CANNOT_TELL  # none waits: the deadline goes on; cannot tell: it waits
        outcome = await self._settle(task.node_id, msg)
        self._metrics.settle_found_waiting(task.kind)
        log.info("lease %s of task %s ran out while its settle waited in GW_SETTLE: applied (%s)",
                 lease_id, task.id, outcome.result)  # fmt: skip
        return outcome.result in ("ok", "repeat")

    async def timed_out(self, task_id: str, attempt_id: str) -> None:
        async def run() -> None:
            task = (
                self._ledger.live.get(task_id) if self._ledger.shared is None else await self._ledger.current(task_id)
            )
            if task is None or task.state != "running" or task.attempt_id != attempt_id:
                return
            if task.lease_id is not None and await self._settled_while_waiting(task, task.lease_id):
                return
            tr = sm.timed_out(task, attempt_id, idgen.new_id("att"), self._delay(task), self._clock())
            await self._ledger.commit(tr, None, dead_letter=await self._dead_letters.dead_letter_for(tr))
            self._ledger.send_cancel(task, Code.TIMEOUT)

        await self._ledger.serial(task_id, run)


def _hand_out(outs: list[asyncio.Future[ClaimReply]], whole: asyncio.Future[list[ClaimReply | BaseException]]) -> None:
    """Each claim's answer of a batch built whole (``claim_many``) to its own future."""
    for i, out in enumerate(outs):
        if out.done():
            continue
        if whole.cancelled():
            out.cancel()
        elif (exc := whole.exception()) is not None:
            out.set_exception(exc)
        elif isinstance(answer := whole.result()[i], BaseException):
            out.set_exception(answer)
        else:
            out.set_result(answer)


def _claim_error(code: str, message: str) -> ClaimReply:
    return ClaimReply(ok=False, error=WireError(code=code, message=message))


def _lease_reply(task: Task) -> ClaimReply:
    return ClaimReply(
        ok=True,
        lease_id=task.lease_id,
        lease_expires_at=fmt_ts(task.lease_expires_at),
        attempt_no=task.attempt_no,
        revision=task.revision,
    )
