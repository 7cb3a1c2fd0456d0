"""The hypothesis state machine of the simulation: users, nodes, the clock and crashes as rules; the
invariants (``invariants.py``) after every step.

A step is one rule: it starts one operation (or none, for a pure clock jump), runs the loop until it is
quiet, and checks. ``arm_crash(k)`` makes the next step's operation stop after ``k`` loop iterations, at
whatever await it reached, and the process crash-restarts there. A failure names the violated invariants,
the simulation seed and the step count; hypothesis prints the shrunk steps that replay it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import msgspec
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler_gateway.actors.model.records import (
    TERMINAL_STATES,
    HistoryEntry,
    Task,
)
from scheduler_gateway.actors.model.schedule import ScheduleSpec, TaskTemplate
from scheduler_gateway.actors.outbox import read_outbox_body
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.actors.scheduling import NewSchedule, SchedulePatch, SpecPatch, TemplatePatch
from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.daemon.nats.bus import SETTLE_ACK_WAIT_S
from scheduler_gateway.daemon.nats.streams import DUPLICATE_WINDOW_S
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.wire.artifacts import ArtifactBegin, ArtifactCommit, ArtifactPut, ArtifactReply
from scheduler_gateway.wire.errors import Code, GatewayError
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.messages import ClaimRequest, HeartbeatRequest, LeaseReport, Settle, WireError
from tests.fakes.memory_store import MemoryStore

from .artifact_invariants import artifact_violations, recorded_under_its_lease
from .durable_view import MemoryView, SqliteView
from .flow_invariants import FairTurns, FlowLog
from .invariants import ChangeLog, Facts, LiveView, snapshot_violations, summarize
from .kind_rules import KindLog, KindRules, kind_committed
from .letter_rules import LetterRules, letter_violations
from .sim_world import (
    ARTIFACT_CHUNK,
    ARTIFACT_KEEPER_S,
    EPOCHS,
    MAX_SKEW_S,
    SCHEDULE_POLICY,
    SIM_WAITING_SCAN_MAX,
    TASK_POLICY,
    Cut,
    NodeLease,
    Pending,
    Sim,
    SimNode,
)
from .workflow_invariants import read_facts, workflow_violations
from .workflow_rules import WorkflowRules

USERS = ("alice", "bob", "root")  # root is an admin
KINDS = ("echo", "work")
CRONS = ("*/15 * * * *", "30 2 * * *", "0 * * * *", "0 3 * * *", "*/5 * * * *", "59 1 * * *", "0 2 * * *")
ZONES = ("America/New_York", "Europe/Berlin", "UTC")
DST_LOCAL_TIMES = ("2026-03-08T02:30:00", "2026-11-01T01:30:00", "2026-03-29T02:30:00", "2026-10-25T02:30:00")
OUTAGE_S = DUPLICATE_WINDOW_S + 30.0  # chaos(outage): down for longer than GW_EVENTS remembers msg ids
ADVANCES = (0.5, 3.0, 12.0, 31.0, 61.0, 301.0, 601.0, 3600.0, 4 * 3600.0)
SKEWS = (0.0, 0.0, 0.4, -0.4, 1.5, -1.5, MAX_SKEW_S, -MAX_SKEW_S)
# the NATS server's clock against the store's: a machine of its own, off by more than the relay's TAIL_SKEW_S
NATS_SKEWS = (0.0, 0.0, 0.0, 2.0, -900.0, 900.0)
# Several instances: where a pause lands (None: at any IO await); the store calls and publishes of the
# decisions another instance can take over
FREEZE_AT = (
    *([None] * 8),  # at any IO await: the next one comes
    *(["claim_due+"] * 4),
    "insert_run",
    "insert_run",
    "record_launch",
    "record_launch",
    "record_completion",
    "apply",
    "apply_many",
    "get_tasks",
    "extend_leases",
    "overdue_running+",
    "outbox_batch+",
    "publish_offers",
    "pending_callbacks+",
    "acquire_duty",
    "record_artifact",
    "bucket_write_meta",
    "bucket_verify",
    # workflows: the releaser's reads its decisions rest on, a finish's compare-and-set, an add under a lease
    "notices",
    "dep_counts",
    "swap_workflow",
    "add_tasks",
)
#: Several instances: the longest single advance (each virtual second costs every instance's timers)
MULTI_MAX_ADVANCE_S = 601.0
KEYS = ("k1", "k2", "k3")
# flow control (CONTRACT 2.10): a few concurrency keys (tenants) and unique keys (kinds' settings: kind_rules.py)
CKEYS = ("ta", "tb", "tc")
UKEYS = ("u1", "u2")
UKEY_CHOICES = (None, None, None, None, None, *UKEYS)  # a unique key on one create in four or so
UNIQUE_FOR = (None, None, 5.0, 60.0, 3600.0)  # the hour: a window that outlives a purge
# artifacts: a few names (so the same name comes again, with the same or other bytes), sizes across the chunk
# size and the limits (sim_world.ARTIFACT_LIMITS: 900 per artifact, 1500 and 4 per task)
ART_NAMES = ("a.txt", "a.txt", "logs/b.log", "c.bin", "d", "e/f/g.json")
ART_SIZES = (0, 5, 130, 300, 300, 700, 1000)
# "resend": the commit is sent again once answered (the SDK's resend after a lost reply); "race": two copies at once
ART_HOW = ("put", "put", "chunks", "chunks", "abandon", "corrupt", "resend", "race")
ART_LEASE = ("current", "current", "current", "current", "old", "foreign")


def art_bytes(name: str, version: int, size: int) -> bytes:
    return (f"{name}:{version};".encode() * (size // 4 + 2))[:size]


SCHEDULE_OPS = (
    "patch_title",
    "patch_to_once",
    "patch_to_cron",
    "patch_kind",
    "pause",
    "resume",
    "trigger",
    "trigger",
    "delete",
)

# Exploration aid while known bugs are being fixed: SIM_IGNORE=name,name skips violations whose text names
# one of these (an invariant's name or a word of its message). Never set in CI.
IGNORED = tuple(x for x in os.environ.get("SIM_IGNORE", "").split(",") if x)

STATS = {"steps": 0, "examples": 0, "crashes": 0, "violations": 0}
#: How often the runs reached the situations the newer invariants are about (printed with the step counts): a
#: simulation that never reaches a window cannot find what breaks in it.
COVERAGE: Counter[str] = Counter()


class Violation(AssertionError):
    pass


def caller(user: str, rid: str | None = None) -> Caller:
    return Caller(user, "admin" if user == "root" else "user", rid)


def digest(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


class Outcome:
    """What a client saw: a value, an error code, or nothing (the process died under it)."""

    def __init__(
        self, value: Any = None, code: str | None = None, lost: bool = False, error: GatewayError | None = None
    ) -> None:
        self.value = value
        self.code = code
        self.lost = lost
        self.error = error

    @property
    def ok(self) -> bool:
        return self.code is None and not self.lost


TRANSIENT = frozenset({Code.STORAGE_ERROR, Code.SERVICE_UNAVAILABLE})


class SimMachine(KindRules, LetterRules, WorkflowRules, RuleBasedStateMachine):
    store_factory: Callable[[], Any] = MemoryStore
    on_sqlite = False  # True: a SqliteStore on a fresh file per example (store_factory unused)
    instances = 1  # > 1: that many gateway instances on one shared store (a SharedMemoryStore)

    def __init__(self) -> None:
        super().__init__()
        self.sim: Sim | None = None
        self.log = ChangeLog(max_dead_retries=TASK_POLICY.max_dead_retries)
        self.task_ids: list[str] = []
        self.owner_of: dict[str, str] = {}
        self.threads: list[tuple[str, str]] = []
        self.schedule_ids: list[str] = []
        self.idem: dict[tuple[str, str], tuple[str, str, str] | None] = {}  # -> (operation, body, task id)
        self.nodes = [SimNode("n1", ["echo", "work"]), SimNode("n2", ["echo"]), SimNode("n3", ["work"])]
        self.cut_next: int | None = None
        self.problems: list[str] = []
        #: settles held in GW_SETTLE while their lease was the task's current one and no instance was frozen
        #: mid-deadline: lease id -> (task id, the task's revision then); its next change must not be a deadline's
        self.held_current: dict[str, tuple[str, int]] = {}
        #: node id -> the last quiet moment more of its settles were held than one read returns (Facts)
        self.crowded_until: dict[str, float] = {}
        self.advanced = 0.0
        self.faulted = False
        self.rid = 0
        self.tmpdir: Path | None = None
        # the fencing checks: schedule id -> [(claimer, claim number)], and the lease each claim took
        self.claims: dict[str, list[tuple[tuple[int, int], int]]] = {}
        self.claim_no = 0
        self.sched_lease: dict[str, float | None] = {}
        # flow control: the rules judged at every commit, and the dispatchers' turns at every offer
        self.flow = FlowLog(coverage=COVERAGE)
        self.fair = FairTurns(COVERAGE)
        self.kinds_log = KindLog(COVERAGE)  # every committed change of a kind's settings (kind_rules.py)
        self.step_started = 0.0
        self.artifacts_due = False  # a clock step long enough for the artifact keeper's rounds
        #: tasks retention purged, as last stored: what a refusal may still name (a unique key's window)
        self.purged: dict[str, Task] = {}
        self.purged_history: dict[str, list[HistoryEntry]] = {}
        #: every history entry whose change the store answered as committed, by task and revision: the history
        #: of a task purged where the purge rule did not see it go (a purge that finished in a later step, a
        #: change that committed in the purge's own step)
        self.committed_history: dict[str, dict[int, HistoryEntry]] = {}
        #: (task id, revision) of each event body already read (None: not a task's): a stored event never changes,
        #: and reading every one again after each step grew with the run
        self.event_keys: dict[bytes, tuple[str, int] | None] = {}
        self.outbox_keys: dict[bytes, tuple[str, int] | None] = {}  # the same, by an outbox row's body

    # -- plumbing ------------------------------------------------------------------------------------
    @initialize(
        seed=st.integers(0, 2**20),
        epoch=st.sampled_from(sorted(EPOCHS)),
        skews=st.tuples(st.sampled_from(SKEWS), st.sampled_from(SKEWS), st.sampled_from(SKEWS)),
        nats_skew=st.sampled_from(NATS_SKEWS),
    )
    def boot(self, seed: int, epoch: str, skews: tuple[float, float, float], nats_skew: float = 0.0) -> None:
        env_seed = os.environ.get("SIM_INNER_SEED")
        self.seed = int(env_seed) if env_seed else seed
        if self.instances > 1:
            from tests.fakes.memory_shared import SharedMemoryStore

            box: list[Sim] = []
            store = SharedMemoryStore(lambda: box[0].wall())
            self.sim = Sim(
                self.seed, store, EPOCHS[epoch], instances=self.instances, skews=skews, nats_skew_s=nats_skew
            )
            box.append(self.sim)
            self.view = MemoryView(store)
        elif self.on_sqlite:
            self.tmpdir = Path(tempfile.mkdtemp(prefix="sim-sqlite-"))
            path = self.tmpdir / "gateway.db"
            box: list[Sim] = []
            self.sim = Sim(
                self.seed,
                SqliteStore(path, clock=lambda: box[0].wall()),
                EPOCHS[epoch],
                sqlite_path=path,
                nats_skew_s=nats_skew,
            )
            box.append(self.sim)
            self.view: MemoryView | SqliteView = SqliteView(path)
        else:
            self.sim = Sim(self.seed, self.store_factory(), EPOCHS[epoch], nats_skew_s=nats_skew)
            self.sim.durable.store_clock = self.sim.wall  # one process: its clock is the store's
            self.view = MemoryView(self.sim.durable)
        self.sim.write_hooks.append(self._on_store_call)
        self.sim.write_hooks.append(self._artifact_recorded)
        self.sim.write_hooks.append(self.kinds_log.on_store_call)
        self.sim.offer_watch = self.fair
        self._wf_boot(COVERAGE)  # workflows: every claim and skip judged at its commit (workflow_invariants.py)
        self.sim.boot()
        STATS["examples"] += 1

    def teardown(self) -> None:
        if self.sim is not None:
            STATS["crashes"] += self.sim.crashes
            self.sim.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _writer(self) -> tuple[int, int]:
        """Who made the store call the hooks hear of: (instance, incarnation)."""
        assert self.sim is not None
        w = self.sim.worlds[self.sim.writer]
        return (self.sim.writer, -1 if w is None else w.incarnation)

    def _fence_checks(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        """No write of a fenced-out holder commits; every claim lease is judged on the store's clock."""
        assert self.sim is not None
        now = self.sim.now()  # the store's clock
        if name == "claim_due":
            who = self._writer()
            for c in result:
                sid = c.task.id
                before = self.sched_lease.get(sid)
                if before is not None and before > now + 1e-6:
                    self.problem(
                        f"claim_lease_on_the_store_clock: schedule {sid} claimed again by instance {who[0]} at "
                        f"{now:.3f}, its claim lease runs to {before:.3f} on the store's clock"
                    )
                lease = c.task.lease_until
                if lease is not None and abs(lease - (now + SCHEDULE_POLICY.lease_s)) > 1e-6:
                    self.problem(
                        f"claim_lease_on_the_store_clock: schedule {sid} claimed by instance {who[0]} with a lease to "
                        f"{lease:.3f}; the store's clock says {now + SCHEDULE_POLICY.lease_s:.3f}"
                    )
                COVERAGE["schedule claims"] += 1
                if before is not None:
                    COVERAGE["schedule claims taken over"] += 1
                self.sched_lease[sid] = lease
                self.claim_no += 1
                self.claims.setdefault(sid, []).append((who, self.claim_no))
            return
        sid = None
        if name == "insert_run" and args[0].trigger == "scheduled":
            sid = args[0].scheduled_task_id
        elif name == "record_launch" and args[1].holds_lease:
            sid = args[0]
            self.sched_lease[sid] = None
        if sid is None or sid not in self.claims:
            return
        who = self._writer()
        mine = [n for w, n in self.claims[sid] if w == who]
        later = [(w, n) for w, n in self.claims[sid] if mine and n > mine[-1] and w != who]
        if later:
            self.problem(
                f"no_fenced_out_write: instance {who[0]} wrote {name} for schedule {sid} under its claim "
                f"#{mine[-1]}, taken over since by instance {later[-1][0][0]} (claim #{later[-1][1]})"
            )

    def _committed(self, change: Change, now: float) -> None:
        self.log.feed(change)
        self.flow.feed(change, now)
        if change.history is not None:
            self.committed_history.setdefault(change.task.id, {})[change.history.revision] = change.history

    def _gone_history(self, stored: dict[str, list[HistoryEntry]]) -> dict[str, list[HistoryEntry]]:
        """The history of every task the store no longer has: what the purge rule read before it purged, with
        what committed that it did not see."""
        out: dict[str, list[HistoryEntry]] = {}
        for tid in self.purged_history.keys() | self.committed_history.keys():
            if tid in stored:
                continue
            entries = {h.revision: h for h in self.purged_history.get(tid, [])}
            entries.update(self.committed_history.get(tid, {}))
            out[tid] = [entries[r] for r in sorted(entries)]
        return out

    def _on_store_call(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        self._fence_checks(name, args, result)
        assert self.sim is not None
        now = self.sim.now()  # the store's clock, at the commit
        if name == "apply":
            self._committed(args[0], now)
        elif name == "apply_group":  # whole or not at all: it returned, so every change is written
            for change in args[0]:
                self._committed(change, now)
        elif name == "apply_many":
            for change, refused in zip(args[0], result, strict=True):
                if refused is None:
                    self._committed(change, now)
        elif (written := kind_committed(name, args, result)) is not None:
            self.flow.kind_written(written)
        elif name == "put_dead_letter" and result:  # False: its compare-and-set lost, nothing was written
            self.log.put_letter(args[0])
        elif name in ("insert_schedule", "save_schedule", "record_launch", "record_completion", "delete_schedule"):
            sid = args[0] if isinstance(args[0], str) else args[0].id
            self._schedule_written(sid, name)
        elif name == "claim_due":
            for c in result:
                self._schedule_written(c.task.id, name)

    def _artifact_recorded(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        if name == "record_artifact" and result[1]:
            COVERAGE["artifacts recorded"] += 1
            found = recorded_under_its_lease(args[0], args[1].old_revision, self.view.history_after)
            if found is not None:
                self.problem(found)

    def _schedule_written(self, sid: str, why: str) -> None:
        assert self.sim is not None
        s = self.view.schedule(sid)
        self.log.schedule_written(sid, None if s is None else s.status, why)

    @property
    def w(self) -> Any:
        """The instance the next request reaches: the target, or while it is frozen another one (a client or a
        node times out on a frozen instance and tries the next; what it sent there still waits at its gate)."""
        assert self.sim is not None and self.sim.world is not None
        sim = self.sim
        if sim.world.freezer.frozen:
            for i, world in enumerate(sim.worlds):
                if world is not None and not world.freezer.frozen:
                    sim.target = i
                    break
        return sim.world

    def next_rid(self) -> str:
        self.rid += 1
        return f"req_{self.rid}"

    def do(self, make: Callable[[], Awaitable[Any]], advance: float = 0.0) -> Outcome:
        """Run one operation as a step: to quiescence, or cut by an armed crash (then crash-restart)."""
        assert self.sim is not None
        cut, self.cut_next = self.cut_next, None
        self.sim.steps += 1
        STATS["steps"] += 1
        self.advanced = advance
        self.step_started = self.sim.now()
        self.sim.bus.in_step = True
        try:
            result = self.sim.run(make(), advance, cut)
        except GatewayError as exc:
            return Outcome(code=exc.code, error=exc)
        finally:
            self.sim.bus.in_step = False
        if isinstance(result, Cut):
            who, self.sim.bus.cut_world = self.sim.bus.cut_world, None  # chaos(outage) cut it: that process dies
            self.sim.crash(index=who, downtime=0.0 if who is None else OUTAGE_S)
            # the step stopped before (some of) its advance, and the new process has had no time yet: what
            # liveness expects after time passed is for a later step
            self.advanced = 0.0
            return Outcome(lost=True)
        if isinstance(result, Pending):
            return Outcome(lost=True)
        return Outcome(result)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def _thread_of(self, user: str, i: int | None) -> str | None:
        """A thread for ``user``'s task: one of its own when it has any (another user's answers as missing,
        which ``i`` past them still tries), so thread lanes fill up."""
        if i is None or not self.threads:
            return None
        own = [t for t, owner in self.threads if owner == user]
        pool = own if own and i % 4 else [t for t, _ in self.threads]
        return pool[i % len(pool)]

    def pick_task(self, i: int) -> str | None:
        return self.task_ids[i % len(self.task_ids)] if self.task_ids else None

    APT_STATES: ClassVar[dict[str, tuple[str, ...]]] = {
        "cancel": ("waiting_approval", "queued", "running"),
        "approve": ("waiting_approval",),
        "amend": ("waiting_approval", "queued"),
        "retry": ("failed", "dead", "canceled"),
        "rework": ("succeeded", "failed"),
    }

    def pick_apt(self, i: int, action: str) -> str | None:
        states = self.APT_STATES[action]
        apt = [t for t in self.task_ids if (self.view.task(t) is not None and self.view.task(t).state in states)]
        return apt[i % len(apt)] if apt else self.pick_task(i)

    # -- users: tasks --------------------------------------------------------------------------------
    @rule(
        user=st.sampled_from(USERS),
        kind=st.sampled_from(KINDS),
        parent=st.none() | st.integers(0, 50),
        thread=st.none() | st.integers(0, 20) | st.integers(0, 20),  # a thread task two times in three
        key=st.none() | st.sampled_from(KEYS),
        labels=st.sampled_from(["none", "plain", "reserved_run", "reserved_gw"]),
        approval=st.booleans(),
        callback=st.sampled_from([None, "ok", "fail"]),
        max_attempts=st.integers(1, 3),
        delay=st.sampled_from([None, 0.0, 20.0, 400.0]),
        lease=st.sampled_from([None, 10.0, 60.0]),
        timeout=st.sampled_from([None, 45.0, 200.0]),
        ckey=st.none() | st.sampled_from(CKEYS),
        ukey=st.sampled_from(UKEY_CHOICES),
        ufor=st.sampled_from(UNIQUE_FOR),
        priority=st.sampled_from([0, 0, 0, 5]),
    )
    def create_task(
        self,
        user: str,
        kind: str,
        parent: int | None,
        thread: int | None,
        key: str | None,
        labels: str,
        approval: bool,
        callback: str | None,
        max_attempts: int,
        delay: float | None,
        lease: float | None,
        timeout: float | None,
        ckey: str | None,
        ukey: str | None,
        ufor: float | None,
        priority: int,
    ) -> None:
        assert self.sim is not None
        parent_id = self.pick_task(parent) if parent is not None else None
        thread_id = self._thread_of(user, thread)
        if ukey is not None and labels.startswith("reserved"):
            labels = "plain"  # a unique create is no reserved-label test: that 400 would hide the key's rules
        label_map = {
            "none": {},
            "plain": {"team": "x"},
            "reserved_run": {"scheduledRunId": "srn_forged"},
            "reserved_gw": {"gw.owner": "me"},
        }[labels]
        spec = NewTask(
            kind=kind,
            payload=msgspec.Raw(b'{"n":%d}' % (len(self.task_ids) % 3)),
            max_attempts=max_attempts,
            parent_id=parent_id,
            thread_id=thread_id,
            requires_approval=approval,
            labels=label_map,
            callback_url=None if callback is None else f"https://cb.example/{callback}",
            callback_secret=None,
            not_before=None if delay is None else self.sim.now() + delay,
            lease_s=lease,
            timeout_s=timeout,
            retry_backoff_s=5.0,
            priority=priority,
            concurrency_key=ckey,
            unique_key=ukey,
            unique_for_s=ufor if ukey is not None else None,
        )
        body = digest("create", kind, parent_id, thread_id, labels, approval, callback, max_attempts, delay, lease,
                      timeout, spec.payload, priority, ckey, ukey, spec.unique_for_s)  # fmt: skip
        parent_state = self._stored_state(parent_id) if parent_id else None
        out = self.do(lambda: self.w.service.create(caller(user, self.next_rid()), spec, key, body))
        if out.ok:
            task, replayed = out.value
            if not replayed:
                self._made(task)
                if task.thread_id:
                    COVERAGE["thread tasks"] += 1
            if parent_state in TERMINAL_STATES and not replayed:
                self.problem(f"create under {parent_state} parent {parent_id} answered 201 (expected 409)")
            if labels.startswith("reserved") and not replayed:
                self.problem(f"create with reserved labels {label_map} answered 201 (expected 400)")
        elif out.code == Code.DUPLICATE_TASK:
            COVERAGE["flow: creates refused DUPLICATE_TASK"] += 1
            self._duplicate_named(user, spec, out.error)
        self._idem_check(user, key, "create", body, out)

    @rule(i=st.integers(0, 50), ufor=st.sampled_from([None, 60.0, 3600.0]), purged=st.booleans())
    def create_unique_again(self, i: int, ufor: float | None, purged: bool) -> None:
        """The same unique job submitted again: a create with the owner, kind and uniqueKey of a task made before
        (one retention purged, with ``purged``). The FlowLog judges what commits, ``_duplicate_named`` a refusal."""
        assert self.sim is not None
        if purged:
            pool = [t for t in self.purged.values() if t.unique_key is not None]
        else:
            pool = [t for tid in self.task_ids if (t := self.view.task(tid)) is not None and t.unique_key is not None]
        if not pool:
            return
        prior = pool[i % len(pool)]
        spec = NewTask(kind=prior.kind, payload=msgspec.Raw(b'{"again":1}'), unique_key=prior.unique_key,
                       unique_for_s=ufor, retry_backoff_s=5.0)  # fmt: skip
        out = self.do(lambda: self.w.service.create(caller(prior.owner, self.next_rid()), spec, None, ""))
        if out.ok:
            task, _ = out.value
            self._made(task)
        elif out.code == Code.DUPLICATE_TASK:
            COVERAGE["flow: creates refused DUPLICATE_TASK"] += 1
            self._duplicate_named(prior.owner, spec, out.error)

    def _made(self, task: Task) -> None:
        """A task the machine created: what its rules pick from, and whose it is."""
        self.task_ids.append(task.id)
        self.owner_of[task.id] = task.owner

    def _duplicate_named(self, user: str, spec: NewTask, err: GatewayError | None) -> None:
        """A DUPLICATE_TASK names a task of the same owner, kind and uniqueKey that holds the key: live, or
        made within ``uniqueForSeconds``, or ended during this very step (after it refused)."""
        named = str(err.details.get("taskId", "")) if err is not None else ""
        other = self.view.task(named)
        if other is None and named in self.purged:
            other = self.purged[named]
            COVERAGE["flow: DUPLICATE_TASK naming a purged task"] += 1
        if spec.unique_key is None or other is None:
            self.problem(f"DUPLICATE_TASK for a create with uniqueKey {spec.unique_key} names {named!r}: no such task")
            return
        if (other.owner, other.kind, other.unique_key) != (user, spec.kind, spec.unique_key):
            self.problem(f"DUPLICATE_TASK for {user}/{spec.kind}/{spec.unique_key} names {named} of "
                         f"{other.owner}/{other.kind}/{other.unique_key}")  # fmt: skip
        elif other.state in TERMINAL_STATES and spec.unique_for_s is None:
            last = self.view.history_after(named, other.revision - 1)
            if not last or last[-1].at < self.step_started - MAX_SKEW_S:
                self.problem(f"DUPLICATE_TASK without uniqueForSeconds names {named}, {other.state} before the create")

    @rule(
        user=st.sampled_from(USERS),
        kinds=st.lists(st.sampled_from(KINDS), min_size=2, max_size=4),
        thread=st.none() | st.integers(0, 20),
        approvals=st.lists(st.booleans(), min_size=4, max_size=4),
        ckeys=st.lists(st.none() | st.sampled_from(CKEYS), min_size=4, max_size=4),
        ukeys=st.lists(st.sampled_from(UKEY_CHOICES), min_size=4, max_size=4),
        ufor=st.sampled_from(UNIQUE_FOR),
        idem=st.lists(st.none() | st.sampled_from(KEYS), min_size=4, max_size=4),
    )
    def create_batch(
        self,
        user: str,
        kinds: list[str],
        thread: int | None,
        approvals: list[bool],
        ckeys: list[str | None],
        ukeys: list[str | None],
        ufor: float | None,
        idem: list[str | None] | None = None,  # None: no keys (the recorded cases from before keys were drawn)
    ) -> None:
        """``POST /api/tasks/batch``: a few tasks in one request, all in one thread when ``thread`` is given
        (a chain of steps), some waiting for approval, with concurrency and unique keys (a unique key twice in one
        batch: the second is refused alone), and idempotency keys, shared with the creates alone (a key twice in
        one batch: each item answers as if sent alone, after the one before it)."""
        from scheduler_gateway.actors.tasks.api import BatchItem

        assert self.sim is not None
        thread_id = self._thread_of(user, thread)
        items = []
        for n, kind in enumerate(kinds):
            spec = NewTask(
                kind=kind,
                payload=msgspec.Raw(b'{"b":%d}' % n),
                max_attempts=2,
                thread_id=thread_id,
                requires_approval=approvals[n],
                retry_backoff_s=5.0,
                concurrency_key=ckeys[n],
                unique_key=ukeys[n],
                unique_for_s=ufor if ukeys[n] is not None else None,
            )
            body = digest("batch", kind, n, thread_id, approvals[n], ckeys[n], ukeys[n], spec.unique_for_s)
            items.append(BatchItem(spec, idem[n] if idem else None, body))
        out = self.do(lambda: self.w.service.create_many(caller(user, self.next_rid()), items))
        for n, item in enumerate(items):  # each item answers alone, in order, as a create with its key would
            if out.ok:
                res = out.value[n]
                one = Outcome(res) if not isinstance(res, GatewayError) else Outcome(code=res.code, error=res)
            else:
                one = out
            self._idem_check(user, item.key, "create", item.body_hash, one)
        if not out.ok:
            return
        for item, res in zip(items, out.value, strict=True):
            if isinstance(res, GatewayError) and res.code == Code.DUPLICATE_TASK:
                COVERAGE["flow: batch items refused DUPLICATE_TASK"] += 1
                self._duplicate_named(user, item.spec, res)
            if isinstance(res, BaseException):
                continue
            task, replayed = res
            if not replayed:
                self._made(task)
                if task.thread_id:
                    COVERAGE["thread tasks"] += 1

    @rule(
        user=st.sampled_from(USERS),
        kind=st.sampled_from(KINDS),
        keys=st.permutations(CKEYS),
        big=st.integers(2, 5),
    )
    def create_flood(self, user: str, kind: str, keys: list[str], big: int) -> None:
        """One tenant floods a kind (``big`` tasks of one concurrency key in a batch) and another adds one after
        it: the keys must take turns, and a key held by its own limit must come back when a slot of it frees."""
        from scheduler_gateway.actors.tasks.api import BatchItem

        assert self.sim is not None
        specs = [keys[0]] * big + [keys[1]]
        items = [
            BatchItem(NewTask(kind=kind, payload=msgspec.Raw(b'{"f":%d}' % n), max_attempts=2, concurrency_key=k))
            for n, k in enumerate(specs)
        ]
        out = self.do(lambda: self.w.service.create_many(caller(user, self.next_rid()), items))
        if not out.ok:
            return
        for res in out.value:
            if not isinstance(res, BaseException) and not res[1]:
                self._made(res[0])
        COVERAGE["flow: floods of one key"] += 1

    def _stored_state(self, task_id: str | None) -> str | None:
        assert self.sim is not None
        t = self.view.task(task_id)
        return None if t is None else t.state

    def _idem_check(self, user: str, key: str | None, operation: str, body: str, out: Outcome) -> None:
        """An idempotent replay equals the first answer; the key with another request conflicts."""
        if key is None:
            return
        slot = (user, key)
        first = self.idem.get(slot, "absent")
        if out.lost:
            if first == "absent":
                self.idem[slot] = None  # unknown: the first answer was lost with the process
            return
        if first == "absent" or first is None:
            if out.ok:
                self.idem[slot] = (operation, body, out.value[0].id)
            return
        assert isinstance(first, tuple)
        op0, body0, tid0 = first
        if (op0, body0) == (operation, body):
            if not out.ok and out.code in TRANSIENT and self.faulted:
                return  # the store failed under an injected fault: a 503 the client retries, not a wrong answer
            if out.code == Code.TASK_NOT_FOUND and tid0 in self.purged:
                return  # its task was purged before the key's own age (docs/OPERATIONS.md: tasks_s >= idempotency_s)
            if not out.ok:
                self.problem(f"replay of {operation} with key {key} by {user} answered {out.code}, first {tid0}")
            elif out.value[0].id != tid0:
                self.problem(f"replay of {operation} with key {key} answered {out.value[0].id}, first {tid0}")
        elif out.ok:
            self.problem(f"key {key} of {user} reused for {operation} (first {op0}) and accepted")

    @rule(
        who=st.sampled_from(["owner", "owner", "owner", "other", "root"]),
        i=st.integers(0, 50),
        action=st.sampled_from(["cancel", "cancel", "approve", "approve", "amend", "retry", "rework"]),
        revision=st.sampled_from(["none", "none", "current", "stale"]),
        key=st.none() | st.sampled_from(KEYS),
        apt=st.booleans(),
    )
    def act(self, who: str, i: int, action: str, revision: str, key: str | None, apt: bool) -> None:
        """An action on a task; with ``apt``, on one whose stored state allows it (when there is one), so that
        approvals, retries and reworks happen as often as cancels."""
        tid = self.pick_apt(i, action) if apt else self.pick_task(i)
        if tid is None:
            return
        owner = self.owner_of[tid]
        user = {"owner": owner, "root": "root", "other": "bob" if owner != "bob" else "alice"}[who]
        stored = self.view.task(tid) if self.sim else None
        rev = None
        if revision != "none" and stored is not None:
            rev = stored.revision if revision == "current" else stored.revision - 1
        payload = msgspec.Raw(b'{"amended":%d}' % i) if action in ("amend", "rework") else None
        reason = "again" if action == "rework" else ("stop" if action == "cancel" else None)
        key = None if action == "cancel" else key
        body = digest(action, rev, reason, payload)
        before = stored
        rid = self.next_rid()

        out = self.do(
            lambda: self.w.service.act(
                caller(user, rid),
                tid,
                action,
                expected_revision=rev,
                reason=reason,
                payload=payload,
                idem_key=key,
                body_hash=body if key else "",
            )
        )
        if out.ok and action == "approve" and before is not None and before.thread_id:
            COVERAGE["thread approvals"] += 1
        if user not in (owner, "root"):
            if out.ok:
                self.problem(f"user {user} did {action} on {tid} of {owner}")
            elif not out.lost and out.code not in (Code.TASK_NOT_FOUND, Code.STORAGE_ERROR):
                self.problem(f"user {user} {action} on foreign {tid}: {out.code}, expected TASK_NOT_FOUND")
            return
        if out.code in (Code.REVISION_CONFLICT, Code.INVALID_STATE_TRANSITION, Code.TASK_ALREADY_TERMINAL):
            # what changed the task meanwhile is named by its history: a lease that expired, a settle, another
            # instance's write that a thaw let through are not this request's
            mine = (
                []
                if before is None
                else [h for h in self.view.history_after(tid, before.revision) if h.request_id == rid]
            )
            if mine and not key:
                self.problem(f"refused {action} ({out.code}) of {tid} changed it: {[h.action for h in mine]}")
        self._idem_check(user, key, f"{action}:{tid}", body, out)

    @rule(
        i=st.integers(0, 50),
        action=st.sampled_from(["amend", "retry", "approve", "rework"]),
        key=st.sampled_from(KEYS),
    )
    def concurrent_same_key(self, i: int, action: str, key: str) -> None:
        """Two requests with one Idempotency-Key at once: the second waits and replays the first."""
        import asyncio

        tid = self.pick_task(i)
        if tid is None:
            return
        user = self.owner_of[tid]
        payload = msgspec.Raw(b'{"amended":%d}' % i) if action in ("amend", "rework") else None
        reason = "again" if action == "rework" else None
        body = digest(action, None, reason, payload)

        def one() -> Awaitable[Any]:
            return self.w.service.act(
                caller(user, self.next_rid()), tid, action, reason=reason, payload=payload, idem_key=key, body_hash=body
            )

        async def both() -> list[Any]:
            return await asyncio.gather(one(), one(), return_exceptions=True)

        out = self.do(both)
        if not out.ok:
            if not out.lost:
                self._idem_check(user, key, f"{action}:{tid}", body, out)
            else:
                self._idem_check(user, key, f"{action}:{tid}", body, out)
            return
        a, b = out.value
        codes = [getattr(x, "code", None) if isinstance(x, BaseException) else None for x in (a, b)]
        for x in (a, b):
            if isinstance(x, BaseException) and not isinstance(x, GatewayError):
                raise x
        if not isinstance(a, BaseException):
            if isinstance(b, BaseException):
                self.problem(f"concurrent {action} of {tid} with key {key}: first ok, second {codes[1]}")
            elif b[0].id != a[0].id:
                self.problem(f"concurrent {action} with key {key}: two different answers")
            self._idem_check(user, key, f"{action}:{tid}", body, Outcome(a))
        else:
            self._idem_check(user, key, f"{action}:{tid}", body, Outcome(code=codes[0]))

    @rule(i=st.integers(0, 50), force=st.booleans(), as_owner=st.booleans())
    def dead_letter_retry(self, i: int, force: bool, as_owner: bool) -> None:
        assert self.sim is not None
        tid = self.pick_task(i)
        if tid is None:
            return
        letter = self.view.letter(tid)
        if letter is None:
            return
        owner = self.owner_of[tid]
        user = owner if as_owner else ("root" if force else ("bob" if owner != "bob" else "alice"))
        out = self.do(
            lambda: self.w.service.redrive(
                caller(user, self.next_rid()), letter.dead_letter_id, force=force, reason="sim"
            )
        )
        if out.ok and user not in (owner, "root"):
            self.problem(f"user {user} redrove letter {letter.dead_letter_id} of {owner}")
        if out.ok and letter.exhausted and not force:
            self.problem(f"redrive of exhausted letter {letter.dead_letter_id} accepted")

    # -- threads and schedules --------------------------------------------------------------------------
    @rule(user=st.sampled_from(USERS))
    def create_thread(self, user: str) -> None:
        out = self.do(lambda: self.w.schedules.create_thread(caller(user), "t"))
        if out.ok:
            self.threads.append((out.value.id, user))

    @rule(
        user=st.sampled_from(USERS),
        kind=st.sampled_from(KINDS),
        cron=st.none() | st.sampled_from(CRONS),
        zone=st.sampled_from(ZONES),
        once=st.sampled_from(["+61", "+3600", "+7200", "dst0", "dst1", "dst2", "dst3"]),
        reuse=st.none() | st.integers(0, 20),
        max_attempts=st.integers(1, 2),
        ckey=st.none() | st.sampled_from(CKEYS),
        ukey=st.sampled_from(UKEY_CHOICES),
    )
    def create_schedule(
        self,
        user: str,
        kind: str,
        cron: str | None,
        zone: str,
        once: str,
        reuse: int | None,
        max_attempts: int,
        ckey: str | None,
        ukey: str | None,
    ) -> None:
        spec = self._spec(cron, zone, once)
        if spec is None:
            return
        thread_id = None
        if reuse is not None and self.threads:
            thread_id = self.threads[reuse % len(self.threads)][0]
        cmd = NewSchedule(
            title="s",
            template=TaskTemplate(
                kind=kind,
                payload=msgspec.Raw(b"{}"),
                max_attempts=max_attempts,
                lease_s=30.0,
                concurrency_key=ckey,
                unique_key=ukey,
            ),
            schedule=spec,
            context_mode="reuse_thread" if thread_id else "fresh_thread_per_run",
            thread_id=thread_id,
        )
        out = self.do(lambda: self.w.schedules.create_scheduled_task(caller(user), cmd))
        if out.ok:
            self.schedule_ids.append(out.value.id)
            self.owner_of[out.value.id] = user

    def _spec(self, cron: str | None, zone: str, once: str) -> ScheduleSpec | None:
        assert self.sim is not None
        try:
            if cron is not None:
                return ScheduleSpec.from_primitives("cron", zone, cron=cron)
            if once.startswith("+"):
                at = self.sim.now() + float(once[1:])
                return ScheduleSpec(type="once", timezone=zone, run_at=at)
            return ScheduleSpec.from_primitives("once", zone, run_at=DST_LOCAL_TIMES[int(once[3:])])
        except GatewayError:
            return None

    @rule(
        i=st.integers(0, 20),
        op=st.sampled_from(SCHEDULE_OPS),
        cron=st.sampled_from(CRONS),
        zone=st.sampled_from(ZONES),
        as_owner=st.booleans(),
    )
    def schedule_op(self, i: int, op: str, cron: str, zone: str, as_owner: bool) -> None:
        assert self.sim is not None
        if not self.schedule_ids:
            return
        sid = self.schedule_ids[i % len(self.schedule_ids)]
        owner = self.owner_of[sid]
        user = owner if as_owner else ("bob" if owner != "bob" else "alice")
        c = caller(user, self.next_rid())
        svc = self.w.schedules
        make: Callable[[], Awaitable[Any]]
        if op.startswith("patch"):
            if op == "patch_title":
                patch = SchedulePatch(title=f"t{i}")
            elif op == "patch_kind":
                patch = SchedulePatch(template=TemplatePatch(kind="work"))
            elif op == "patch_to_once":
                patch = SchedulePatch(schedule=SpecPatch(type="once", run_at=_iso(self.sim.now() + 120.0)))
            else:
                patch = SchedulePatch(schedule=SpecPatch(type="cron", cron=cron, timezone=zone))
            make = lambda: svc.update_scheduled_task(c, sid, patch)  # noqa: E731
        elif op == "pause":
            make = lambda: svc.pause_task(c, sid)  # noqa: E731
        elif op == "resume":
            make = lambda: svc.resume_task(c, sid)  # noqa: E731
        elif op == "trigger":
            make = lambda: svc.trigger_task(c, sid)  # noqa: E731
        else:
            make = lambda: svc.delete_task(c, sid)  # noqa: E731
        out = self.do(make)
        if user != owner:
            if out.ok:
                self.problem(f"user {user} did {op} on schedule {sid} of {owner}")
            elif not out.lost and out.code not in (Code.SCHEDULE_NOT_FOUND, Code.STORAGE_ERROR):
                self.problem(f"user {user} {op} on foreign schedule {sid}: {out.code}, expected SCHEDULE_NOT_FOUND")

    # -- nodes ------------------------------------------------------------------------------------------
    @rule(n=st.integers(0, 2), i=st.integers(0, 10), again=st.sampled_from(["no", "no", "same", "twin"]))
    def claim(self, n: int, i: int, again: str) -> None:
        """``again``: the offer is delivered once more (its ack lost) and claimed by the same process, which gets
        its lease back, or by a twin (a second worker started with the node's id), which must be refused."""
        assert self.sim is not None
        node = self.nodes[n]
        bus = self.sim.bus
        mine = [a for a in bus.offer_order if bus.offers[a].kind in node.kinds]
        if not mine:
            return
        attempt_id = mine[i % len(mine)]
        bus.offer_order.remove(attempt_id)
        offer = bus.offers.pop(attempt_id)
        req = ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id, process_id=node.process)
        out = self.do(lambda: self.w.service.claim(node.id, req))
        if not out.ok:
            return
        reply = out.value
        if reply.ok:
            self._granted(node, offer, reply.lease_id)
            if again == "same":
                out2 = self.do(lambda: self.w.service.claim(node.id, req))
                if out2.ok and (not out2.value.ok or out2.value.lease_id != reply.lease_id):
                    self.problem(f"second claim of {offer.attempt_id} by {node.id} answered {out2.value}")
            elif again == "twin":
                twin = msgspec.structs.replace(req, process_id=f"{node.id}-twin")
                out2 = self.do(lambda: self.w.service.claim(node.id, twin))
                if out2.ok and out2.value.ok:
                    self.problem(
                        f"lease_of_one_process: attempt {offer.attempt_id} leased to process {node.process} was "
                        f"granted to process {twin.process_id} of node {node.id} too (lease {out2.value.lease_id})"
                    )
                elif out2.ok:
                    COVERAGE["claims by a twin process refused"] += 1
        elif reply.error is not None and reply.error.code in (Code.NOT_DUE, Code.NODE_DRAINING, "LIMITED"):
            self._nak(offer, reply.error)

    def _granted(self, node: SimNode, offer: Any, lease_id: str | None) -> None:
        """A claim answered ok: the lease is this process's, and no other process may hold it (a lease a
        previous process of the node claimed, its offer delivered again after a restart)."""
        assert lease_id is not None
        for other in self.nodes:
            for held in (*other.leases.values(), *other.old_leases):
                if held.lease_id == lease_id and held.process != node.process:
                    self.problem(
                        f"lease_of_one_process: lease {lease_id} of process {held.process} was granted again to "
                        f"process {node.process}"
                    )
        node.leases[offer.task_id] = NodeLease(offer.task_id, offer.attempt_id, lease_id, node.process, offer)

    @rule(n=st.integers(0, 2))
    def restart_node(self, n: int) -> None:
        """The node's worker dies and starts again with the same node id: a new process, which knows none of the
        old one's leases. The old one may have died before it acked their offers, so they come again; the
        new process's claims of them must be refused, the leases run out and their attempts run again."""
        assert self.sim is not None
        node = self.nodes[n]
        bus = self.sim.bus
        for lease in node.leases.values():
            node.old_leases.append(lease)
            if lease.offer is not None and lease.attempt_id not in bus.offers:
                bus.offers[lease.attempt_id] = lease.offer
                bus.offer_order.append(lease.attempt_id)
                COVERAGE["offers of a restarted node delivered again"] += 1
        node.leases.clear()
        node.incarnation += 1

    @rule(n=st.integers(0, 2))
    def claim_all(self, n: int) -> None:
        """A node with free slots pulls every offer of its kinds waiting in the stream and claims them in one
        batch (``gw.claim`` with ``claims``), as a worker with several slots does after a restart."""
        assert self.sim is not None
        node = self.nodes[n]
        bus = self.sim.bus
        mine = [a for a in bus.offer_order if bus.offers[a].kind in node.kinds][:8]
        if not mine:
            return
        offers = []
        for attempt_id in mine:
            bus.offer_order.remove(attempt_id)
            offers.append(bus.offers.pop(attempt_id))
        reqs = [ClaimRequest(task_id=o.task_id, attempt_id=o.attempt_id, process_id=node.process) for o in offers]

        async def batch() -> list[Any]:
            return list(await asyncio.gather(*self.w.service.claim_many(node.id, reqs), return_exceptions=True))

        out = self.do(batch)
        if not out.ok:
            return
        for offer, reply in zip(offers, out.value, strict=True):
            if isinstance(reply, BaseException):
                continue
            if reply.ok:
                self._granted(node, offer, reply.lease_id)
                if offer.thread_id:
                    COVERAGE["thread claims"] += 1
            elif reply.error is not None and reply.error.code in (Code.NOT_DUE, Code.NODE_DRAINING, "LIMITED"):
                self._nak(offer, reply.error)

    def _nak(self, offer: Any, error: WireError) -> None:
        """The node naks the offer: JetStream redelivers it later (once: a re-publish of the attempt meanwhile is
        the same message, ``Nats-Msg-Id``)."""
        assert self.sim is not None
        if error.code == Code.LIMITED:
            rule = error.message.rpartition("(")[2].rstrip(")") if error.message.endswith(")") else "thread"
            COVERAGE[f"flow: claims refused LIMITED ({rule})"] += 1
        bus = self.sim.bus
        if offer.attempt_id not in bus.offers:
            bus.offers[offer.attempt_id] = offer
            bus.offer_order.append(offer.attempt_id)

    @rule(n=st.integers(0, 2), stale=st.booleans(), forged=st.booleans())
    def heartbeat(self, n: int, stale: bool, forged: bool) -> None:
        node = self.nodes[n]
        reports = [LeaseReport(task_id=lease.task_id, lease_id=lease.lease_id) for lease in node.leases.values()]
        if stale and node.old_leases:
            old = node.old_leases[-1]
            reports.append(LeaseReport(task_id=old.task_id, lease_id=old.lease_id))
        if forged:  # another node's lease, as if this node named it
            other = self.nodes[(n + 1) % len(self.nodes)]
            reports += [LeaseReport(task_id=x.task_id, lease_id=x.lease_id) for x in list(other.leases.values())[:1]]
        req = HeartbeatRequest(kinds=node.kinds, capacity=4, running=len(node.leases), leases=reports)
        out = self.do(lambda: self.w.service.heartbeat(node.id, req))
        if out.ok:
            for r in out.value.revoked:
                lease = node.leases.get(r.task_id)
                if lease is not None and lease.lease_id == r.lease_id:
                    node.old_leases.append(node.leases.pop(r.task_id))
            if forged:
                other_ids = {x.lease_id for m in self.nodes if m is not node for x in m.leases.values()}
                bad = [e for e in out.value.extended if e.lease_id in other_ids]
                if bad:
                    self.problem(f"node {node.id} extended another node's lease {bad[0].lease_id}")

    @rule(
        n=st.integers(0, 2),
        i=st.integers(0, 10),
        outcome=st.sampled_from(["succeeded", "succeeded", "failed"]),
        retryable=st.booleans(),
        variant=st.sampled_from(["normal", "normal", "normal", "duplicate", "conflicting"]),
    )
    def settle(self, n: int, i: int, outcome: str, retryable: bool, variant: str) -> None:
        assert self.sim is not None
        node = self.nodes[n]
        if variant == "normal":
            if not node.leases:
                return
            lease = list(node.leases.values())[i % len(node.leases)]
        else:
            done = [x for x in node.old_leases if x.lease_id in node.settled]
            if not done:
                return
            lease = done[i % len(done)]
            prev_outcome, _ = node.settled[lease.lease_id]
            if variant == "duplicate":
                outcome = prev_outcome
            else:
                outcome = "failed" if prev_outcome == "succeeded" else "succeeded"
        msg = _node_settle(lease, outcome, retryable, b'{"r":1}')
        result = bytes(msg.result)
        before = self.view.task(lease.task_id)
        out = self.do(lambda: self.w.service.settle(node.id, msg))
        if variant == "normal":
            node.leases.pop(lease.task_id, None)
            node.old_leases.append(lease)
            if out.ok and out.value.result in ("ok", "repeat"):  # a lost settle never reached the gateway
                node.settled.setdefault(lease.lease_id, (outcome, result))
        if out.ok and out.value.result in ("refused", "repeat"):
            after = self.view.task(lease.task_id)
            if (
                before is not None
                and after is not None
                and after.revision != before.revision
                and self._changed_by_settle(lease.task_id, before.revision)
            ):
                self.problem(f"a {out.value.result} settle of {lease.task_id} changed the task")
        if out.ok and variant == "conflicting" and out.value.result == "ok":
            self.problem(f"a conflicting settle of lease {lease.lease_id} was accepted")

    @rule(
        n=st.integers(0, 2),
        i=st.integers(0, 10),
        outcome=st.sampled_from(["succeeded", "succeeded", "failed"]),
        retryable=st.booleans(),
    )
    def settle_held(self, n: int, i: int, outcome: str, retryable: bool) -> None:
        """The node settles one of its leases and stops heartbeating it; GW_SETTLE stores the settle, but the
        instance it is delivered to freezes or dies before its ack, so it comes again only after the ack wait
        (``deliver_held_settles``). The lease may run out meanwhile: the attempt must then end as the settle
        says, not fail on its deadline and run again."""
        assert self.sim is not None
        node = self.nodes[n]
        if not node.leases:
            return
        lease = list(node.leases.values())[i % len(node.leases)]
        msg = _node_settle(lease, outcome, retryable, b'{"r":3}')
        node.leases.pop(lease.task_id, None)
        node.old_leases.append(lease)
        self.sim.bus.held_settles.setdefault(node.id, []).append(msg)
        COVERAGE["settles held in GW_SETTLE"] += 1
        task = self.view.task(lease.task_id)
        # a frozen instance may be inside a deadline, past its read of what waits: its expiry is then no fault
        if task is not None and task.state == "running" and task.lease_id == lease.lease_id and not self.sim.frozen():
            self.held_current[lease.lease_id] = (task.id, task.revision)

    @rule(n=st.integers(0, 2))
    def deliver_held_settles(self, n: int) -> None:
        """The ack wait passed: GW_SETTLE delivers the node's oldest held settle again, to a live instance; it
        leaves the stream once handled (acked), and stays for another delivery when the handling did not end."""
        assert self.sim is not None
        node = self.nodes[n]
        held = self.sim.bus.held_settles.get(node.id)
        if not held:
            return
        msg = held[0]
        out = self.do(lambda: self.w.service.settle(node.id, msg))
        if out.ok:
            held.remove(msg)
            COVERAGE[f"held settles delivered again: {out.value.result}"] += 1
            if out.value.result in ("ok", "repeat"):
                node.settled.setdefault(msg.lease_id, (msg.outcome, bytes(msg.result)))

    def _held_settles_closed_their_attempts(self) -> list[str]:
        """settle_waiting_closes_its_attempt: a task whose settle waited in GW_SETTLE while its lease was current
        is not failed by that attempt's lease expiry or timeout (the deadline applies the waiting settle)."""
        out = []
        for lease_id, (tid, revision) in list(self.held_current.items()):
            after = self.view.history_after(tid, revision)
            if not after:
                continue
            del self.held_current[lease_id]
            first = after[0]
            if first.action == "attempt_failed" and first.reason in (Code.LEASE_EXPIRED, Code.TIMEOUT):
                out.append(
                    f"settle_waiting_closes_its_attempt: task {tid} failed by {first.reason} at revision "
                    f"{first.revision} while the settle of lease {lease_id} waited in GW_SETTLE"
                )
            elif first.action == "settle":
                COVERAGE["held settles that closed their attempt"] += 1
        return out

    @rule(n=st.integers(0, 2), i=st.integers(0, 50), outcome=st.sampled_from(["succeeded", "failed"]))
    def cancel_while_settling(self, n: int, i: int, outcome: str) -> None:
        """A user cancels a task while a node settles one of its running descendants, in one instant."""
        import asyncio

        tid = self.pick_task(i)
        node = self.nodes[n]
        if tid is None or not node.leases:
            return
        lease = next(iter(node.leases.values()))
        msg = _node_settle(lease, outcome, True, b'{"r":2}')
        owner = self.owner_of[tid]

        async def both() -> list[Any]:
            return await asyncio.gather(
                self.w.service.act(caller(owner, self.next_rid()), tid, "cancel", reason="stop"),
                self.w.service.settle(node.id, msg),
                return_exceptions=True,
            )

        out = self.do(both)
        node.leases.pop(lease.task_id, None)
        node.old_leases.append(lease)
        settled = out.value[1] if out.ok else None
        if settled is not None and not isinstance(settled, BaseException) and settled.result in ("ok", "repeat"):
            node.settled.setdefault(lease.lease_id, (outcome, bytes(msg.result)))

    @rule(n=st.integers(0, 2), offset=st.sampled_from([0.0, 0.0, 0.001, -0.001]))
    def heartbeat_at_expiry(self, n: int, offset: float) -> None:
        """A node heartbeats right at its lease's expiry: the clock's deadline and the heartbeat race."""
        import asyncio

        assert self.sim is not None
        node = self.nodes[n]
        if not node.leases:
            return
        lease = next(iter(node.leases.values()))
        live = self.w.service.ledger.live.get(lease.task_id)
        if live is None or live.lease_expires_at is None:
            return
        wait = max(0.0, live.lease_expires_at - self.sim.now() + offset)
        report = LeaseReport(task_id=lease.task_id, lease_id=lease.lease_id)
        req = HeartbeatRequest(kinds=node.kinds, capacity=4, running=1, leases=[report])

        async def later() -> Any:
            await asyncio.sleep(wait)
            return await self.w.service.heartbeat(node.id, req)

        self.do(later, advance=wait + 0.01)

    @rule(
        n=st.integers(0, 2),
        i=st.integers(0, 10),
        name=st.sampled_from(ART_NAMES),
        size=st.sampled_from(ART_SIZES),
        version=st.sampled_from([0, 0, 0, 1]),
        how=st.sampled_from(ART_HOW),
        lease=st.sampled_from(ART_LEASE),
    )
    def put_artifact(self, n: int, i: int, name: str, size: int, version: int, how: str, lease: str) -> None:
        """A handler's artifact: in one ``put``, or begun, published in chunks by the node itself and committed;
        ``abandon``: the node dies mid-upload (chunks, no commit); ``corrupt``: the commit reports other bytes.
        ``resend``: the commit sent again once answered; ``race``: two copies of the commit sent together.
        ``old``: a lease the node held before; ``foreign``: another node's current lease, sent by this one."""
        assert self.sim is not None
        chosen = self._artifact_lease(n, i, lease)
        if chosen is None:
            return
        node, held = chosen
        data = art_bytes(name, version, size)
        sha = hashlib.sha256(data).hexdigest()
        bucket = self.sim.bucket
        sim = self.sim
        task_id, lease_id = held.task_id, held.lease_id

        async def chunked() -> ArtifactReply:
            w = self.w
            begin = await w.artifacts.handle(
                node.id, ArtifactBegin(task_id=task_id, lease_id=lease_id, name=name, size=size, sha256=sha)
            )
            if not begin.ok or begin.artifact is not None:
                return begin  # type: ignore[no-any-return]
            upload = begin.subject  # sim_world.BucketGate: "<node>.<upload id>"
            pieces = [data[k : k + ARTIFACT_CHUNK] for k in range(0, len(data), ARTIFACT_CHUNK)]
            for k, piece in enumerate(pieces):
                if how == "abandon" and k == len(pieces) // 2:
                    return ArtifactReply(ok=False)  # the node died here: its chunks stay, never committed
                bucket.node_publish(upload, piece, sim.now())
                await asyncio.sleep(0)
            if how == "abandon":
                return ArtifactReply(ok=False)
            reported = sha if how != "corrupt" else hashlib.sha256(data + b"!").hexdigest()
            commit = ArtifactCommit(
                task_id=task_id, lease_id=lease_id, upload_id=upload.rpartition(".")[2], name=name, size=size,
                sha256=reported,
            )  # fmt: skip
            if how == "race":  # two copies of one commit in flight together: one records, the other repeats
                both = await asyncio.gather(*(w.artifacts.handle(node.id, commit) for _ in range(2)))
                return next((r for r in both if r.ok and not r.repeat), both[0])  # type: ignore[no-any-return]
            reply = await w.artifacts.handle(node.id, commit)
            if how == "resend" and reply.ok:  # its reply "lost": the same commit again, a repeat
                await w.artifacts.handle(node.id, commit)
            return reply  # type: ignore[no-any-return]

        async def put() -> ArtifactReply:
            req = ArtifactPut(task_id=task_id, lease_id=lease_id, name=name, size=size, sha256=sha, data=data)
            return await self.w.artifacts.handle(node.id, req)  # type: ignore[no-any-return]

        out = self.do(put if how == "put" else chunked)
        if not out.ok or how == "abandon":
            return
        self._judge_artifact(out.value, how, task_id, name, sha)

    def _artifact_lease(self, n: int, i: int, lease: str) -> tuple[SimNode, NodeLease] | None:
        """Who sends, under which lease: node ``n`` with a lease it held before (``old``) or with another node's
        (``foreign``); else the first node from ``n`` on that runs something, with one of its leases."""
        node = self.nodes[n]
        if lease == "old":
            return (node, node.old_leases[-1 - i % len(node.old_leases)]) if node.old_leases else None
        if lease == "foreign":
            other = self.nodes[(n + 1) % len(self.nodes)]
            return (node, list(other.leases.values())[i % len(other.leases)]) if other.leases else None
        for m in range(len(self.nodes)):
            runner = self.nodes[(n + m) % len(self.nodes)]
            if runner.leases:
                return runner, list(runner.leases.values())[i % len(runner.leases)]
        return None

    def _judge_artifact(self, reply: ArtifactReply, how: str, task_id: str, name: str, sha: str) -> None:
        """What the node was told agrees with the index."""
        answer = "repeat" if reply.repeat else "ok" if reply.ok else reply.error.code if reply.error else "?"
        COVERAGE[f"artifact {how}: {answer}"] += 1
        row = next((r for r in self.view.artifacts() if r.task_id == task_id and r.name == name), None)
        if reply.ok and how == "corrupt" and not reply.repeat:
            self.problem(f"a commit reporting other bytes than stored was recorded: {task_id}/{name}")
        if reply.ok and not reply.repeat and (row is None or row.sha256 != sha):
            self.problem(f"artifact {task_id}/{name} answered as recorded is not in the index with its digest")
        if reply.ok and reply.repeat and row is not None and row.sha256 != sha and how != "corrupt":
            self.problem(f"artifact {task_id}/{name} answered as a repeat of other bytes")
        if (
            reply.error is not None
            and reply.error.code == Code.IDEMPOTENCY_CONFLICT
            and (row is None or row.sha256 == sha)
        ):
            self.problem(f"artifact {task_id}/{name} refused as a conflict without another digest recorded")

    def _changed_by_settle(self, task_id: str, since: int) -> bool:
        assert self.sim is not None
        hist: list[HistoryEntry] = self.view.history_after(task_id, since)
        return any(h.action in ("settle", "attempt_failed") and h.actor.type == "node" for h in hist)

    @rule(keep=st.sampled_from([0.0, 30.0, 300.0]))
    def purge_finished(self, keep: float) -> None:
        """The retention keeper's task purge with ``tasks_s`` = ``keep``, as another writer to the store: the
        terminal tasks finished that long ago go, with their history, unless something still refers to them."""
        assert self.sim is not None
        store = self.sim.durable
        # every stored task, not only those this machine created by request: a schedule's firing, a retried
        # dead letter or a create whose answer was lost made tasks too, and their callbacks name them
        before = self.view.tasks()
        history = self.view.history()
        # what left the store is recorded even when the purge answered a failure: a fault after its commit
        self.do(lambda: store.retention.purge_tasks(self.sim.now() - keep, 50))  # type: ignore[union-attr]
        after = self.view.tasks()
        for tid, task in before.items():
            if tid not in after:
                self.purged[tid] = task
                self.purged_history[tid] = history.get(tid, [])
                COVERAGE["tasks purged"] += 1
                if task.unique_key is not None:
                    COVERAGE["unique tasks purged"] += 1

    # -- the clock, crashes and faults -------------------------------------------------------------------
    @rule(seconds=st.sampled_from(ADVANCES))
    def advance(self, seconds: float) -> None:
        if self.instances > 1:
            seconds = min(seconds, MULTI_MAX_ADVANCE_S)
        self._advance(seconds)
        self.artifacts_due = seconds >= 2 * ARTIFACT_KEEPER_S

    def _advance(self, seconds: float) -> None:
        """Time passes. Past the ack wait the stream delivers held settles again (the oldest first), so a node's
        crowd of them (more than one read returns, which holds its deadlines) does not outlast it: its deadlines
        in the first ack wait meet the crowd, then the excess is delivered and the rest of the time passes. Only
        the excess: the rest stay held, for the deadlines' reads and ``deliver_held_settles``."""
        assert self.sim is not None
        if seconds <= SETTLE_ACK_WAIT_S or not self._crowded_nodes():
            self.do(_idle, advance=seconds)
            return
        self.do(_idle, advance=SETTLE_ACK_WAIT_S)
        for n in self._crowded_nodes():
            node = self.nodes[n]
            self.crowded_until[node.id] = self.sim.now()  # its deadlines waited until now
            while len(self.sim.bus.held_settles.get(node.id, [])) > SIM_WAITING_SCAN_MAX:
                before = len(self.sim.bus.held_settles[node.id])
                self.deliver_held_settles(n)
                if len(self.sim.bus.held_settles.get(node.id, [])) >= before:
                    break  # the delivery did not end (a fault, a cut): the stream tries again later
        self.do(_idle, advance=seconds - SETTLE_ACK_WAIT_S)

    def _crowded_nodes(self) -> list[int]:
        assert self.sim is not None
        held = self.sim.bus.held_settles
        return [n for n, node in enumerate(self.nodes) if len(held.get(node.id, [])) > SIM_WAITING_SCAN_MAX]

    @precondition(lambda self: bool(self.schedule_ids))
    @rule()
    def advance_to_next_fire(self) -> None:
        assert self.sim is not None
        due = [s.next_run_at for s in self.view.schedules().values() if s.next_run_at is not None]
        if not due:
            return
        wait = max(0.0, min(due) - self.sim.now()) + 0.001
        # months ahead (a once at another season's DST change): not worth the rounds
        if wait <= (2 * 86400 if self.instances == 1 else 2 * MULTI_MAX_ADVANCE_S):
            self._advance(wait)

    @rule(what=st.sampled_from(["cut", "cut", "outage", "crash", "fault", "lose", "intrude"]), k=st.integers(1, 40))
    def chaos(self, what: str, k: int) -> None:
        """cut: the next step stops after k loop iterations (any await) and the process crash-restarts there;
        outage: the process that next publishes events dies right after (before the relay deletes their rows)
        and stays down past the event stream's duplicate window before it boots again (a publish again of what
        it had published is stored again, not deduplicated);
        crash: crash-restart now, at a quiet moment; fault: the next 1-3 store calls fail (StorageError);
        lose: the next event publish of more than ``k % 4`` events loses that one on the way; intrude: another
        publisher's message is stored just before that one."""
        assert self.sim is not None
        if what == "cut":
            self.cut_next = k
        elif what == "outage":
            self.sim.bus.crash_after_publish = True
        elif what == "crash":
            self.sim.steps += 1
            STATS["steps"] += 1
            self.sim.crash()
        elif what == "lose":
            self.sim.bus.lose_event_at = k % 4
        elif what == "intrude":
            self.sim.bus.intrude_at = k % 4
        else:
            self.w.store.fail_ops = 1 + k % 3
            self.faulted = True

    # -- several instances: which one a request reaches, pauses --------------------------------------
    @precondition(lambda self: self.instances > 1)
    @rule(i=st.integers(0, 7))
    def route(self, i: int) -> None:
        """The next requests and node messages reach instance ``i`` (a load balancer, a queue group)."""
        assert self.sim is not None
        self.sim.target = i % self.instances

    @precondition(lambda self: self.instances > 1)
    @rule(k=st.integers(0, 3), i=st.sampled_from([None, 0, 1]), at=st.sampled_from(FREEZE_AT))
    def freeze(self, k: int, i: int | None, at: str | None) -> None:
        """An instance stops at its k-th IO await from now (its own background work or a request's; with
        ``at``, the k-th before or after that call) and stays stopped, memory intact, until ``thaw``: longer
        than every lease if time is advanced meanwhile. ``i`` None: whichever instance gets there first."""
        assert self.sim is not None
        if self._pausing():
            return  # one pause at a time, and an armed one keeps its place
        for n, world in enumerate(self.sim.worlds):
            if world is not None and (i is None or n == i % self.instances):
                world.freezer.arm(k, at)
        COVERAGE["freezes armed"] += 1

    @precondition(lambda self: self.instances > 1)
    @rule(
        k=st.integers(0, 3),
        at=st.sampled_from(FREEZE_AT),
        seconds=st.sampled_from([12.0, 61.0, 130.0, 301.0, 601.0]),
        hold=st.sampled_from([12.0, 61.0, 61.0, 130.0]),
    )
    def long_pause(self, k: int, at: str | None, seconds: float, hold: float) -> None:
        """One whole pause in a step: time passes (up to ``seconds``) until an instance reaches the armed await
        and stops there; it stays stopped ``hold`` seconds more (longer than a claim's or the leader's lease,
        mostly) while the others go on, then resumes, stale. No instance got there: the pause is dropped."""
        assert self.sim is not None
        if self._pausing():
            return
        for world in self.sim.worlds:
            if world is not None:
                world.freezer.arm(k, at)
        COVERAGE["long pauses"] += 1
        self.do(_idle, advance=seconds)
        if self.sim.frozen():
            self.do(_idle, advance=hold)
        for world in self.sim.worlds:
            if world is not None:
                world.freezer.countdown = None
        self.thaw()

    def _pausing(self) -> bool:
        assert self.sim is not None
        return bool(self.sim.frozen()) or any(
            w is not None and w.freezer.countdown is not None for w in self.sim.worlds
        )

    @precondition(lambda self: self.instances > 1)
    @rule()
    def thaw(self) -> None:
        """Every frozen instance goes on from where it stopped, with what it knew then."""
        assert self.sim is not None
        for world in self.sim.worlds:
            if world is not None:
                if world.freezer.frozen:
                    COVERAGE["thaws of a frozen instance"] += 1
                world.freezer.thaw()
        self.do(_idle)

    def _offers_waiting(self, thread_only: bool = False) -> bool:
        if self.sim is None:
            return False
        bus = self.sim.bus
        return any(not thread_only or bus.offers[a].thread_id for a in bus.offer_order)

    @precondition(lambda self: self._offers_waiting())
    @rule(thread_only=st.booleans(), skip=st.integers(0, 2))
    def restart_with_offers_in_flight(self, thread_only: bool, skip: int) -> None:
        """A restart (of the target instance) while offers it published still wait in GW_DISPATCH, e.g. of a
        thread's task: the new process knows nothing of them, the nodes still claim them. (``skip``: two times
        in three nothing happens, so restarts do not crowd out the rest.)"""
        assert self.sim is not None
        if skip or (thread_only and not self._offers_waiting(thread_only=True)):
            return
        COVERAGE["restarts with offers waiting"] += 1
        if self._offers_waiting(thread_only=True):
            COVERAGE["restarts with thread offers waiting"] += 1
        self.sim.steps += 1
        STATS["steps"] += 1
        self.sim.crash()

    @rule(user=st.sampled_from(("alice", "bob")), i=st.integers(0, 50))
    def reads(self, user: str, i: int) -> None:
        """A user's reads stay inside what it owns: lists and foreign ids."""
        from scheduler_gateway.actors.ports import TaskQuery

        out = self.do(lambda: self.w.service.list_tasks(caller(user), TaskQuery(limit=500)))
        if out.ok:
            foreign = [t.id for t in out.value[0] if t.owner != user]
            if foreign:
                self.problem(f"user {user} listed foreign tasks {foreign[:3]}")
        tid = self.pick_task(i)
        if tid is not None and self.owner_of[tid] != user:
            got = self.do(lambda: self.w.service.get(caller(user), tid))
            if got.ok:
                self.problem(f"user {user} read foreign task {tid}")
        sout = self.do(lambda: self.w.schedules.list_tasks(caller(user), limit=500))
        if sout.ok:
            foreign = [s.id for s in sout.value[0] if s.owner != user]
            if foreign:
                self.problem(f"user {user} listed foreign schedules {foreign[:3]}")

    # -- invariants --------------------------------------------------------------------------------------
    @invariant()
    def holds(self) -> None:
        if self.sim is None or self.sim.world is None:
            return
        for n in self._crowded_nodes():
            self.crowded_until[self.nodes[n].id] = self.sim.now()
        facts = self.facts()
        liveness = self.advanced >= 60.0 and not self.faulted and self.w.store.fail_ops == 0
        liveness = liveness and not self.sim.frozen()
        found = snapshot_violations(facts, liveness=liveness)
        found += letter_violations(facts.tasks, facts.history, facts.letters, facts.max_dead_retries)
        if self.w.store.fail_ops == 0:
            self.faulted = False if self.advanced >= 60.0 else self.faulted
        found += self.log.violations + self.log.pending_cascades() + self.problems
        found += self._held_settles_closed_their_attempts()
        found += self.flow.violations + self.fair.violations
        found += self.kinds_log.violations(self.view.kinds())
        assert self.wf_log is not None
        found += self.wf_log.violations + workflow_violations(
            read_facts(self.view), facts.tasks, liveness=liveness, ever_canceled=self.wf_log.ever_canceled,
            callback_ids=facts.callback_ids_posted, purged=self.purged,
        )  # fmt: skip
        due, self.artifacts_due = self.artifacts_due and liveness and not self.sim.bus.down, False
        found += artifact_violations(self.view.artifacts(), facts.tasks, self.sim.bucket, self.sim.now(), due=due)
        if liveness and not self.sim.bus.down and self._outbox_late():
            found.append("events_reach_the_stream: the outbox kept events after time passed")
        found += [f"loop_error: {e}" for e in self.sim.loop_errors]
        if self.sim.loop.livelock is not None:
            found.append(f"no_livelock: the loop never got quiet at t={self.sim.now()}: {self.sim.loop.livelock}")
        found = [v for v in found if not any(name in v for name in IGNORED)]
        if found:
            STATS["violations"] += 1
            raise Violation(
                f"{len(found)} invariant violation(s) after step {self.sim.steps} (simulation seed {self.seed}, "
                f"{self.sim.crashes} crashes so far):\n{summarize(dict.fromkeys(found))}"
            )

    def _outbox_late(self) -> bool:
        """Events still in the outbox that the relay should have moved: any (one instance: a commit wakes the
        relay), or one older than the leader's poll and a takeover (several: another instance's commit is
        found by the poll) or than a failed round's backoff (one instance whose publish was just lost)."""
        assert self.sim is not None
        if self.instances == 1 and self.w.relay._trouble is None:
            return bool(self.view.outbox_size())
        # several instances, or one whose last round failed (a publish lost): the relay tries again after its
        # backoff (at most 15 s), so only an event older than that and a round is late
        oldest = self.view.outbox_oldest_at()
        return oldest is not None and oldest < self.sim.now() - 30.0

    def facts(self) -> Facts:
        assert self.sim is not None
        v = self.view
        svc = self.w.service
        live = LiveView(dict(svc.ledger.live), dict(svc.lease_clock._lease_due), dict(svc.lease_clock._timeout_due))
        posts = [h.get("X-Callback-Id", "") for w in self.sim.worlds if w is not None for _, h, _ in w.poster.posts]
        return Facts(
            now=self.sim.now(),
            tasks=v.tasks(),
            history=(stored_history := v.history()),
            letters=v.letters(),
            schedules=v.schedules(),
            runs=v.runs(),
            live=live if self.instances == 1 else None,  # several: each instance keeps only what it watches
            max_dead_retries=TASK_POLICY.max_dead_retries,
            # (seq, event id), "" for another publisher's message
            events_published=[(e.seq, e.msg_id if is_id(e.msg_id, "evt") else "") for e in self.sim.bus.events],
            task_events=(
                {k for e in self.sim.bus.events if is_id(e.msg_id, "evt") and (k := self._event_key(e.body))},
                {k for body in v.outbox_bodies() if (k := self._event_key(body, outbox=True))},
            ),
            callback_ids_posted=posts,
            purged_history=self._gone_history(stored_history),
            deadlines_held_until=dict(self.crowded_until),
        )

    def _event_key(self, body: bytes, *, outbox: bool = False) -> tuple[str, int] | None:
        """(task id, revision) of a stream body, or of the stream body an outbox row holds; each read once."""
        memo = self.outbox_keys if outbox else self.event_keys
        if body not in memo:
            memo[body] = _task_event(_outbox_message(body) if outbox else body)
        return memo[body]


async def _idle() -> None:
    return None


def _node_settle(lease: NodeLease, outcome: str, retryable: bool, ok_result: bytes) -> Settle:
    """A node's settle of ``lease``: ``ok_result`` when it succeeded, else null with a handler error."""
    return Settle(
        task_id=lease.task_id,
        attempt_id=lease.attempt_id,
        lease_id=lease.lease_id,
        outcome=outcome,  # type: ignore[arg-type]
        result=msgspec.Raw(ok_result if outcome == "succeeded" else b"null"),
        error=None if outcome == "succeeded" else WireError(code="HANDLER_ERROR", message="x", retryable=retryable),
    )


def _task_event(body: bytes) -> tuple[str, int] | None:
    """(task id, revision) of a task event's stream body."""
    doc = json.loads(body)
    if doc.get("aggregateType") != "task" or doc.get("revision") is None:
        return None
    return str(doc["aggregateId"]), int(doc["revision"])


def _outbox_message(body: bytes) -> bytes:
    """The stream body an outbox row holds (every row the stores write reads back)."""
    entry = read_outbox_body(body)
    assert entry is not None, body
    return bytes(entry.wire)


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
