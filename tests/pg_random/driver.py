"""The randomized run: steps of operations drawn from ``random.Random(seed)``, routed to either instance, with
pauses that make read-modify-write races interleave on the real database; the invariants after every step.

A step is one group of operations, run in one of four ways:

- ``solo``: one operation;
- ``together``: two or three at once (the event loop interleaves them at every database round trip);
- ``freeze``: the first is frozen at its k-th store-call boundary (``Freezer``), the others run to their end
  on the other instance, then the first resumes with what it read before the freeze;
- ``lock``: a third connection holds the lock of a row they touch (a kind, a dead letter, a task) while they
  run, and lets it go once one of them waits for it, so their writes queue up behind reads already made.

The operations are the simulation's: creates, claims, settles (success, or failure: to death, or to failed), a
task's cancel, retry and rework, a dead letter's retry and force-retry, the keeper's sweep (automatic redrive,
archiving), a kind's partial settings change, pause and resume. Targets are drawn from the rows as they are
before the step, and the later operations of a group lean to the first one's object, so that they race on it.

A failure names the seed (``SIM_PG_SEED``), the step, the violations and the steps that touched the objects
named in them (the database's timing is not the seed's, so a replay of the seed finds the same races often,
not always; the printed steps are the evidence).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from scheduler_gateway.actors.model.flow import Rate
from scheduler_gateway.actors.model.records import ActorRef, Task
from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.wire.errors import GatewayError
from scheduler_gateway.wire.messages import ClaimRequest, Settle, WireError

from .checks import KindLog, flow_violations, snapshot_violations
from .world import Instance, Observer, Rows

#: the kinds whose settings the operations change; tasks of ``TASK_KINDS``' last one are never held back, so
#: they keep dying and feeding the dead letters while the others are paused or limited
KINDS = ("echo", "work")
TASK_KINDS = (*KINDS, "free")
CKEYS = (None, "ta", "tb")
NODES = ("n1", "n2")
#: creates stop at this many tasks that can still change without a retry, or this many in all
MAX_LIVE = 20
MAX_TASKS = 80
ENDED = ("succeeded", "canceled")
ROOT = Caller("root", "admin", None)
KIND_VALUES: dict[str, tuple[Any, ...]] = {
    "paused": (True, False),
    "concurrency": (None, 0, 1, 2, 3),
    "key_concurrency": (None, 1, 2),
    "rate": (None, Rate(limit=50, period_s=60.0)),
}
#: where a freeze lands: the k-th pass through a store-call boundary (two per call: before it, after it)
FREEZE_AT = (0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, 10, 12)
#: ... counting every call (None), or only the passes of one read's calls (after it found something: "+"), by the
#: frozen operation: where a decision has been read and not yet written. A name the code does not call (``get_kind``
#: before the kinds' compare-and-set, ``read_kind`` after it) just leaves the step unfrozen.
FREEZE_ON: dict[str, tuple[str | None, ...]] = {
    "sweep": (
        *(None, "get_dead_letter+", "get_dead_letter+", "get_task+"),
        *("due_dead_letters+", "archivable_dead_letters+"),
    ),
    "kind_put": (None, "get_kind", "read_kind"),
}
FREEZE_ON["pause"] = FREEZE_ON["resume"] = FREEZE_ON["kind_put"]
#: how long a lock pause may last at most, and how long nobody must finish before a waiting lock is let go
LOCK_MAX_S = 3.0
LOCK_QUIET_S = 0.05
OP_TIMEOUT_S = 30.0
#: what a freeze step prefers to freeze
DECIDERS = ("sweep", "sweep", "sweep", "kind_put", "pause", "resume")
#: a failure's report shows the steps that touched the objects it names, and this many last steps whatever they did
RECENT = 4


@dataclass
class Op:
    name: str
    inst: int
    target: str = ""  # the object: a task id, or a kind
    args: dict[str, Any] = field(default_factory=dict)
    outcome: str = ""

    def describe(self, labels: dict[str, str]) -> str:
        target = labels.get(self.target, self.target)
        args = "".join(f" {k}={v!r}" for k, v in self.args.items() if k not in ("attempt", "lease", "node", "letter"))
        return f"{self.name}@{'AB'[self.inst]}({target}{args}) -> {self.outcome}"


@dataclass
class Step:
    index: int
    mode: str
    ops: list[Op]
    detail: str = ""

    def describe(self, labels: dict[str, str]) -> str:
        return f"#{self.index} {self.mode}{self.detail}: " + "; ".join(o.describe(labels) for o in self.ops)


class Violation(AssertionError):
    pass


class RandomRun:
    """One seeded run of ``steps`` steps on two instances of one database."""

    def __init__(self, url: str, seed: int, steps: int, leave_out: frozenset[str] = frozenset()) -> None:
        self.seed = seed
        self.leave_out = leave_out  # operation names never drawn (SIM_PG_LEAVE_OUT: e.g. to look past one defect)
        self.steps = steps
        self.rng = random.Random(seed)
        self.instances = [Instance(0, url), Instance(1, url)]
        self.observer = Observer(url)
        self.kind_log = KindLog()
        self.labels: dict[str, str] = {}  # task id -> t<n>, in creation order
        self.log: list[Step] = []
        self.counts: Counter[str] = Counter()

    # -- running -------------------------------------------------------------------------------------
    async def run(self) -> Counter[str]:
        quiet = logging.getLogger("scheduler_gateway")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # refused races log by the hundred; the invariants judge
        await self.observer.start()
        for inst in self.instances:
            await inst.start()
        i = 0
        try:
            for i in range(self.steps):
                await self.step(i)
            # how far the run got: letters that reached exhaustion and archiving are the keeper's windows
            rows = await self.observer.rows()
            for d in rows.letters.values():
                state = "archived" if d.archived else "exhausted" if d.exhausted else "active"
                self.counts[f"letters {state} at the end"] += 1
        except Exception as exc:
            if not isinstance(exc, Violation):  # an operation that broke outright: its seed and steps too
                exc.add_note(f"pg_random: seed {self.seed}, step {i}; the last steps:")
                for s in self.log[-RECENT:]:
                    exc.add_note("  " + s.describe(self.labels))
            raise
        finally:
            quiet.setLevel(level)
            for inst in self.instances:
                await inst.stop()
            await self.observer.stop()
        return self.counts

    async def step(self, index: int) -> None:
        before = await self.observer.rows()
        step = self.draw(index, before)
        self.log.append(step)
        if step.mode == "freeze":
            await self._frozen(step)
        elif step.mode == "lock":
            await self._locked(step, before)
        else:
            await asyncio.gather(*(self.execute(op) for op in step.ops))
        self.counts[step.mode] += 1
        for op in step.ops:
            self.counts[f"{op.name} {op.outcome}"] += 1
        after = await self.observer.rows()
        kinds = {op.target for op in step.ops if op.name in ("kind_put", "pause", "resume")}
        found = (
            snapshot_violations(after, time.time())
            + self.kind_log.violations(after)
            + flow_violations(before, after, kinds)
        )
        if found:
            raise Violation(self.report(step, found))

    async def _frozen(self, step: Step) -> None:
        first, rest = step.ops[0], step.ops[1:]
        inst = self.instances[first.inst]
        freezer = inst.freezer
        inst.froze.clear()
        k = self.rng.choice(FREEZE_AT)
        on = self.rng.choice(FREEZE_ON.get(first.name, (None,)))
        if on is not None:
            k = self.rng.choice((0, 0, 0, 1, 2))  # a named read: one of its first passes
        step.detail = f" {'AB'[first.inst]} at k={k}" + (f" of {on}" if on else "")
        freezer.arm(k, on)
        held = asyncio.create_task(self.execute(first))
        froze = asyncio.create_task(inst.froze.wait())
        await asyncio.wait((held, froze), timeout=OP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        froze.cancel()
        if not freezer.frozen:
            step.detail += " (ended before it)"
        self.counts[f"freeze {'taken' if freezer.frozen else 'missed'}: {first.name}"] += 1
        try:
            await asyncio.gather(*(self.execute(op) for op in rest))
        finally:
            freezer.thaw()
            await held

    async def _locked(self, step: Step, rows: Rows) -> None:
        table, key = self._lock_target(step.ops[0], rows)
        locked = await self.observer.lock(table, key)
        step.detail = f" {table} {self.labels.get(key, key)}" + ("" if locked else " (no row)")
        running = [asyncio.create_task(self.execute(op)) for op in step.ops]
        try:
            if locked:
                loop = asyncio.get_running_loop()
                give_up = loop.time() + LOCK_MAX_S
                pending = set(running)
                while pending and loop.time() < give_up:
                    done, pending = await asyncio.wait(pending, timeout=LOCK_QUIET_S)
                    if not done and await self.observer.lock_waiters() > 0:
                        break  # someone waits for the row and nothing else moves: let the queue go
        finally:
            if locked:
                await self.observer.unlock()
            await asyncio.gather(*running)

    def _lock_target(self, op: Op, rows: Rows) -> tuple[str, str]:
        if op.name in ("kind_put", "pause", "resume"):
            return "kinds", op.target
        task = rows.tasks.get(op.target)
        if task is not None and task.id in rows.letters and self.rng.random() < 0.7:
            return "dead_letters", rows.letters[task.id].dead_letter_id
        if task is not None:
            return "tasks", task.id
        letters = list(rows.letters.values())
        if letters:
            return "dead_letters", self.rng.choice(letters).dead_letter_id
        return "kinds", self.rng.choice(KINDS)

    async def execute(self, op: Op) -> None:
        inst = self.instances[op.inst]
        try:
            op.outcome = await asyncio.wait_for(self._call(inst, op), OP_TIMEOUT_S)
        except GatewayError as exc:
            op.outcome = f"refused {exc.code}"

    async def _call(self, inst: Instance, op: Op) -> str:
        svc = inst.service
        a = op.args
        if op.name == "create":
            task, _ = await svc.create(ROOT, NewTask(kind=a["kind"], concurrency_key=a["key"]))
            self.labels[task.id] = f"t{len(self.labels) + 1}"
            op.target = task.id
            return "ok"
        if op.name == "claim":
            reply = await svc.claim(a["node"], ClaimRequest(task_id=op.target, attempt_id=a["attempt"]))
            return "ok" if reply.ok else f"refused {reply.error.code if reply.error else '?'}"
        if op.name == "settle":
            ok = a["outcome"] == "succeeded"
            msg = Settle(
                task_id=op.target,
                attempt_id=a["attempt"],
                lease_id=a["lease"],
                outcome=a["outcome"],
                result=msgspec.Raw(b'{"ok":true}' if ok else b"null"),
                error=None if ok else WireError(code="HANDLER_ERROR", message="boom", retryable=a["retryable"]),
            )
            settled = await svc.settle(a["node"], msg)
            return settled.code or str(settled.result)
        if op.name in ("cancel", "retry", "rework"):
            await svc.act(ROOT, op.target, op.name)
            return "ok"
        if op.name in ("dl_retry", "dl_force"):
            await svc.redrive(ROOT, a["letter"], force=op.name == "dl_force", reason="test")
            return "ok"
        if op.name == "sweep":
            await inst.keeper.sweep()
            return "ok"
        # kind_put, pause, resume
        change = self.kind_log.begin(op.target, a, f"#{len(self.log) - 1} {op.name}@{'AB'[op.inst]}")
        try:
            await inst.kinds.update(op.target, a, ActorRef("user", "root"), None)
        except BaseException:
            self.kind_log.end(change, acked=False)
            raise
        self.kind_log.end(change, acked=True)
        return "ok"

    # -- drawing -------------------------------------------------------------------------------------
    def draw(self, index: int, rows: Rows) -> Step:
        r = self.rng.random()
        mode = "solo" if r < 0.2 else "together" if r < 0.4 else "freeze" if r < 0.8 else "lock"
        first = self.draw_op(rows, None)
        if mode == "freeze" and self.rng.random() < 0.5:
            # a pause matters most in what reads, decides and writes back: the keeper's sweep, a kind's change
            deciders = [n for n in DECIDERS if n not in self.leave_out]
            if not any(not d.archived and (d.exhausted or not d.requeued) for d in rows.letters.values()):
                deciders = [n for n in deciders if n != "sweep"]  # nothing it would act on
            if deciders:
                first = self._op_on(rows, self.rng.choice(deciders), first.inst, None) or first
        ops = [first]
        if mode != "solo":
            for _ in range(self.rng.choice((1, 1, 2))):
                ops.append(self.draw_op(rows, first if self.rng.random() < 0.75 else None))
        if mode == "freeze":  # the others run while the first is frozen: on the other instance
            for op in ops[1:]:
                op.inst = 1 - first.inst
        return Step(index, mode, ops)

    def draw_op(self, rows: Rows, near: Op | None) -> Op:
        inst = self.rng.randrange(2)
        if near is not None:
            related = self._related(rows, near, inst)
            if related is not None:
                return related
        tasks = list(rows.tasks.values())
        weights = {
            "create": 3 if len(tasks) < MAX_TASKS and sum(t.state not in ENDED for t in tasks) < MAX_LIVE else 0,
            "claim": 3,
            "settle": 4,
            "cancel": 1,
            "retry": 2,
            "rework": 1,
            "dl_retry": 2,
            "dl_force": 2,
            "sweep": 3,
            "kind_put": 2,
            "pause": 1,
            "resume": 1,
        }
        for name in self.leave_out:
            weights[name] = 0
        for _ in range(20):
            name = self.rng.choices(list(weights), list(weights.values()))[0]
            op = self._op_on(rows, name, inst, None)
            if op is not None:
                return op
        return self._create(inst)

    def _related(self, rows: Rows, near: Op, inst: int) -> Op | None:
        """An operation on the object ``near`` works on: the same kind, task or dead letter."""
        if near.name in ("kind_put", "pause", "resume"):
            name = self.rng.choice(("kind_put", "kind_put", "pause", "resume", "claim"))
            if name in self.leave_out:
                return None
            if name == "claim":
                queued = [t for t in rows.tasks.values() if t.state == "queued" and t.kind == near.target]
                return self._claim(self.rng.choice(queued), inst) if queued else None
            return self._kind_op(name, near.target, inst)
        task = rows.tasks.get(near.target)
        if near.name == "sweep" or task is None:
            # the letters a sweep acts on (due, or to archive) rather than any
            letters = sorted(rows.letters.values(), key=lambda d: (d.last_dead_at, d.dead_letter_id))
            due = [d.task_id for d in letters if not (d.archived or d.exhausted or d.requeued)]
            old = [d.task_id for d in letters if d.exhausted and not d.archived]
            lettered = [d.task_id for d in letters]
            if not lettered:
                return None
            # the sweep's first letter of each kind (its order: oldest death first) more often than any other
            firsts = [ids[0] for ids in (due, old) if ids]
            task = rows.tasks[self.rng.choice(firsts if firsts and self.rng.random() < 0.7 else lettered)]
        names = ["retry", "dl_retry", "dl_force", "sweep", "cancel", "claim", "settle", "rework"]
        self.rng.shuffle(names)
        for name in names:
            if name in self.leave_out:
                continue
            op = self._op_on(rows, name, inst, task)
            if op is not None:
                return op
        return None

    def _op_on(self, rows: Rows, name: str, inst: int, task: Task | None) -> Op | None:
        """``name`` on ``task`` (None: on a task drawn among those it applies to); None when it applies to none."""
        tasks = [task] if task is not None else list(rows.tasks.values())
        if name == "create":
            return self._create(inst)
        if name == "sweep":
            return Op("sweep", inst)
        if name in ("kind_put", "pause", "resume"):
            return self._kind_op(name, self.rng.choice(KINDS), inst)
        if name == "claim":
            fit = [t for t in tasks if t.state == "queued"]
            return self._claim(self.rng.choice(fit), inst) if fit else None
        if name == "settle":
            fit = [t for t in tasks if t.state == "running"]
            if not fit:
                return None
            t = self.rng.choice(fit)
            outcome = "succeeded" if self.rng.random() < 0.2 else "failed"
            args = {"outcome": outcome, "attempt": t.attempt_id, "lease": t.lease_id, "node": t.node_id}
            if outcome == "failed":  # retryable: dead (one attempt per budget); else failed, for a retry or rework
                args["retryable"] = self.rng.random() < 0.85
            return Op("settle", inst, t.id, args)
        if name == "cancel":
            fit = [t for t in tasks if t.state in ("queued", "running")]
            return Op("cancel", inst, self.rng.choice(fit).id) if fit else None
        if name == "retry":
            fit = [t for t in tasks if t.state in ("failed", "dead", "canceled")]
            return Op("retry", inst, self.rng.choice(fit).id) if fit else None
        if name == "rework":  # a requeue that is no redrive: the letter's counts must not move
            fit = [t for t in tasks if t.state in ("succeeded", "failed")]
            return Op("rework", inst, self.rng.choice(fit).id) if fit else None
        # dl_retry, dl_force: a dead task's letter mostly, any letter sometimes (a refusal is an answer too)
        fit = [t for t in tasks if t.id in rows.letters]
        dead = [t for t in fit if t.state == "dead"]
        if not fit:
            return None
        t = self.rng.choice(dead if dead and self.rng.random() < 0.85 else fit)
        return Op(name, inst, t.id, {"letter": rows.letters[t.id].dead_letter_id})

    def _create(self, inst: int) -> Op:
        return Op("create", inst, "", {"kind": self.rng.choice(TASK_KINDS), "key": self.rng.choice(CKEYS)})

    def _claim(self, t: Task, inst: int) -> Op:
        return Op("claim", inst, t.id, {"attempt": t.attempt_id, "node": self.rng.choice(NODES)})

    def _kind_op(self, name: str, kind: str, inst: int) -> Op:
        if name != "kind_put":
            return Op(name, inst, kind, {"paused": name == "pause"})
        fields = self.rng.sample(list(KIND_VALUES), self.rng.choice((1, 1, 2)))
        return Op(name, inst, kind, {f: self.rng.choice(KIND_VALUES[f]) for f in fields})

    # -- reporting -----------------------------------------------------------------------------------
    def report(self, step: Step, found: list[str]) -> str:
        text = "\n".join(found)
        for task_id, label in self.labels.items():
            text = text.replace(task_id, label)
        named = set(re.findall(r"\bt\d+\b", text)) | {k for k in KINDS if re.search(rf"\b{k}\b", text)}
        ids = {tid for tid, label in self.labels.items() if label in named}

        def touches(s: Step) -> bool:
            # a sweep touches whatever letter it finds: the recent ones are shown
            return s.index > step.index - RECENT or any(op.target in ids or op.target in named for op in s.ops)

        trail = [s.describe(self.labels) for s in self.log if touches(s)]
        return (
            f"pg_random: seed {self.seed} (replay: SIM_PG_SEED={self.seed} SIM_PG_STEPS={step.index + 1}"
            f" pytest tests/pg_random), step {step.index} of {self.steps} broke:\n{text}\n"
            f"the steps that touched {', '.join(sorted(named)) or 'them'}, and the last {RECENT}:\n  "
            + "\n  ".join(trail[-40:])
        )


def describe_counts(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))


async def run_seed(url: str, seed: int, steps: int, leave_out: frozenset[str] = frozenset()) -> Counter[str]:
    return await RandomRun(url, seed, steps, leave_out).run()
