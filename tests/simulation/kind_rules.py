"""Kinds' settings in the simulation (docs/INVARIANTS.md, "Kinds' settings"): the operator's changes of a kind
and what the machine checks of them after every step.

- ``KindRules`` (a mixin of ``SimMachine``): ``PUT /api/kinds/{kind}`` with some of its fields (``paused``,
  ``concurrency``, ``keyConcurrency``, ``rate``, ``keyRate``, ``null`` removals; ``POST pause`` and ``resume``
  are changes of ``paused``) sent to either instance or written by a writer outside every instance; and two
  changes of one kind that meet: the first one's instance stops at its k-th IO await inside the change
  (``sim_world.Freezer``: after its read, before its write...), the second is made meanwhile through another
  instance (or the outside writer), then the first goes on with what it knew.
- ``KindLog``: every committed write of a kind's settings, in commit order (the store calls' hook), with what
  the change that made it meant to change (its request id names it). ``violations``: each field holds the value
  of the last committed change of that field; a change made through another field's request never takes it
  back. A change whose commit nobody saw (its process died under the store call) leaves its fields unknown until
  the next change of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from scheduler_gateway.actors.kinds import FIELDS, KindService
from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.records import ActorRef

KIND_NAMES = ("echo", "work")  # the kinds the machine's tasks have
KIND_ADMIN = ActorRef("user", "root")
RATES = st.builds(Rate, limit=st.integers(1, 3), period_s=st.sampled_from([2.0, 5.0, 20.0]))
KIND_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "paused": st.sampled_from([False, False, True]),  # a paused kind starts nothing: not too often
        "concurrency": st.sampled_from([None, 0, 1, 1, 2, 3]),
        "key_concurrency": st.sampled_from([None, 1, 1, 2]),
        "rate": st.none() | RATES,
        "key_rate": st.none() | RATES,
    },
)
#: the two ways an operator's change reaches the store: pause / resume, or a PUT of some fields
ONE_CHANGE = st.one_of(st.builds(lambda p: {"paused": p}, st.booleans()), KIND_CHANGES)
#: the store calls that write a kind's settings (the fixed store's compare-and-set among them)
KIND_WRITES = ("put_kind", "swap_kind")
VIAS = ("target", "target", "other", "outside")
_UNKNOWN = object()


def kind_committed(name: str, args: tuple[Any, ...], result: Any) -> KindSettings | None:
    """The settings a store call wrote, or None (not a kind's write, or a compare-and-set that lost)."""
    if name not in KIND_WRITES or result is False:
        return None
    settings = args[0]
    assert isinstance(settings, KindSettings)
    return settings


class KindLog:
    """What each field of each kind must hold: the value of the last committed change of that field."""

    def __init__(self, coverage: Counter[str]) -> None:
        self.coverage = coverage
        self.intents: dict[str, tuple[str, frozenset[str]]] = {}  # request id -> (kind, the fields it changes)
        self.seen: set[str] = set()  # the request ids whose commit the hook saw
        #: (kind, field) -> (value, request id of the change that set it, acknowledged) or _UNKNOWN
        self.expect: dict[tuple[str, str], Any] = {}
        self.acked: set[str] = set()

    def intend(self, rid: str, kind: str, changes: dict[str, Any]) -> None:
        self.intents[rid] = (kind, frozenset(changes))

    def on_store_call(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        settings = kind_committed(name, args, result)
        if settings is None:
            return
        rid = getattr(args[1], "request_id", None)
        kind, fields = self.intents.get(rid or "", (settings.kind, frozenset(FIELDS)))  # unknown: every field
        assert kind == settings.kind, (kind, settings.kind)
        for f in fields:
            self.expect[(kind, f)] = (getattr(settings, f), rid)
        if rid is not None:
            self.seen.add(rid)

    def ended(self, rid: str, ok: bool, died: bool) -> None:
        """The change's call returned (``ok``), raised, or its process died under it (``died``): a commit the hook
        did not see may have happened then (a SQLite write finished under a cancelled await)."""
        if ok:
            self.acked.add(rid)
            return
        if died and rid not in self.seen:
            kind, fields = self.intents[rid]
            for f in fields:
                self.expect[(kind, f)] = _UNKNOWN

    def violations(self, stored: dict[str, KindSettings]) -> list[str]:
        out: list[str] = []
        for (kind, f), want in sorted(self.expect.items(), key=lambda kv: kv[0]):
            if want is _UNKNOWN:
                continue
            value, rid = want
            have = getattr(stored.get(kind) or KindSettings(kind=kind), f)
            if have != value:
                how = "acknowledged" if rid in self.acked else "committed, not yet answered"
                out.append(
                    f"kind_settings_kept: kind {kind} holds {f}={have!r}, but the last change of {f} ({rid}, "
                    f"{how}) set {value!r} and no later change of {f} committed"
                )
        return out


class OutsideKinds:
    """The durable store as a writer outside every instance sees it (a third instance): no gate, no pause; its
    calls reach the machine's store hooks as the instances' do."""

    def __init__(self, store: Any, hook: Callable[[str, tuple[Any, ...], Any], None]) -> None:
        self._store = store
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        hook = self._hook

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            hook(name, args, result)
            return result

        return call


class KindRules:
    """Operators' changes of kinds (a mixin of ``SimMachine``; it uses the machine's ``sim``, ``w``, ``do``,
    ``next_rid`` and ``kinds_log``)."""

    sim: Any
    instances: int
    kinds_log: KindLog
    w: Any

    do: Callable[..., Any]
    next_rid: Callable[[], str]

    def _kind_service(self, via: str, besides: Any = None) -> KindService:
        """The KindService a change goes through: ``target``'s; ``other``: that of an instance other than
        ``besides`` (default: the target; with one instance: the target's); ``outside``: a writer of its own on
        the store."""
        target = self.w
        if via == "other" and self.instances > 1:
            avoid = target if besides is None else besides
            return next((w for w in self.sim.worlds if w is not None and w is not avoid), target).kinds  # type: ignore[no-any-return]
        if via == "outside":
            return KindService(
                OutsideKinds(self.sim.durable.kinds, self.sim.on_store_call),
                lambda s: None,
                self.sim.wall,
                on_committed=target.relay.notify,  # one instance: its relay finds the event (its poll, sooner)
            )
        return target.kinds  # type: ignore[no-any-return]

    def _change(self, svc: KindService, kind: str, changes: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
        """The change as the step's operation; ``KindLog`` hears how it ended, whenever that is."""
        rid = self.next_rid()
        log = self.kinds_log
        log.intend(rid, kind, changes)

        async def change() -> KindSettings:
            ok = died = False
            try:
                new = await svc.update(kind, changes, KIND_ADMIN, rid)
                ok = True
                return new
            except BaseException as exc:
                died = not isinstance(exc, Exception) or "process" in str(exc)  # cancelled, or a dead process
                raise
            finally:
                log.ended(rid, ok, died)

        return change

    @rule(kind=st.sampled_from(KIND_NAMES), changes=ONE_CHANGE, via=st.sampled_from(VIAS))
    def set_kind(self, kind: str, changes: dict[str, Any], via: str) -> None:
        """``PUT /api/kinds/{kind}`` or ``POST pause|resume`` through the target instance's KindService, which
        hands the settings to its dispatcher; ``other``: through another instance's (the target learns them by
        its refresh); ``outside``: another writer straight to the store (a third instance): with one instance its
        dispatcher offers by stale settings until a restart, and only the store's check holds the limits."""
        svc = self._kind_service(via)
        out = self.do(self._change(svc, kind, changes))
        if out.ok:
            self.kinds_log.coverage[f"flow: kind settings changed ({via})"] += 1
            if out.value.paused:
                self.kinds_log.coverage["flow: kind paused"] += 1

    @rule(
        kind=st.sampled_from(KIND_NAMES),
        first=ONE_CHANGE,
        second=ONE_CHANGE,
        via=st.sampled_from(["other", "other", "outside", "target"]),
        k=st.integers(0, 3),
    )
    def kind_changes_meet(self, kind: str, first: dict[str, Any], second: dict[str, Any], via: str, k: int) -> None:
        """Two operators change one kind at the same moment (a pause on one instance, a PUT on another): the first
        change's instance stops at its k-th IO await from now (inside the change, mostly: after its read, before
        its write...), the second is made meanwhile through ``via``; then the first's instance goes on. With one
        instance only the outside writer can go on meanwhile; ``target``: the second waits behind the first on the
        same instance (or reaches another one when the target is frozen, as a client that times out does)."""
        if any(w is not None and (w.freezer.frozen or w.freezer.countdown is not None) for w in self.sim.worlds):
            return  # one pause at a time, and an armed one keeps its place
        if self.instances == 1 and via != "outside":
            via = "outside"
        world = self.w
        world.freezer.arm(k)
        first_out = self.do(self._change(world.kinds, kind, first))
        frozen = world.freezer.frozen
        world.freezer.countdown = None
        svc2 = self._kind_service(via, besides=world)
        second_out = self.do(self._change(svc2, kind, second))
        world.freezer.thaw()
        self.do(_idle)
        cov = self.kinds_log.coverage
        cov["kinds: changes that met"] += 1
        if frozen and first_out.lost and second_out.ok:
            cov["kinds: a change made while another's instance was paused inside its own"] += 1


async def _idle() -> None:
    return None
