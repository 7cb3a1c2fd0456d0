"""Kinds as objects (docs/FLOW.md): each kind's flow settings, kept in the store, audited, announced as
``kind.updated`` events, and handed to the dispatcher, which offers by them.

The store's check at claim time is what holds the limits exactly; this service only keeps the dispatcher's
copy current: on every change made here, and (several instances) by reading the store's settings every
``refresh_s``, so a change made on another instance reaches this one's dispatcher within that time. A write's
``kind.updated`` event is in the outbox when ``put_kind`` returns; ``on_committed`` (the event relay's wake-up,
as for task changes) moves it to the stream at once instead of at the relay's next idle poll.

Several instances change one kind's row at once (a pause on one, a ``PUT`` of its concurrency on another): a
change is decided on the settings as read (``read_kind``) and written by a compare-and-set on the stored document
(``swap_kind``); when another change committed in between, nothing is written and the change is decided again on
what is stored now. So concurrent changes of different fields all hold, the last committed change of a field
wins, and the audit entry, the event and the answer carry the settings as committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict

from . import idgen
from .model.flow import KindSettings
from .model.kind_limits import check_changes
from .model.records import SYSTEM, ActorRef, AuditEntry, EventRecord
from .runtime import cancel_and_wait
from .store_ports import KindStore

log = logging.getLogger(__name__)

REFRESH_S = 1.0
#: how often a change is decided again after losing its compare-and-set before it answers 409 (each loss means
#: another change of the kind committed meanwhile: only a storm of changes of one kind gets there)
MAX_TRIES = 32
#: the fields of a kind a change may set (an absent field is unchanged, None removes a limit)
FIELDS = ("paused", "concurrency", "key_concurrency", "rate", "key_rate")


class KindService:
    def __init__(
        self,
        store: KindStore,
        sink: Callable[[KindSettings], None],
        clock: Callable[[], float],
        *,
        defaults: tuple[KindSettings, ...] = (),
        refresh_s: float | None = None,
        on_committed: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._sink = sink
        self._on_committed = on_committed
        self._clock = clock
        self._defaults = defaults
        self._refresh_s = refresh_s
        self._known: dict[str, KindSettings] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._refresher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Hand the stored settings to the dispatcher, and store the configured starting values of kinds that
        have none (``[kinds.<kind>]``)."""
        await self._load()
        for d in self._defaults:
            if d.kind not in self._known:
                # only where no row is: a change another instance made meanwhile is never replaced by the config
                await self._write(msgspec.structs.replace(d, updated_at=self._clock()), SYSTEM, None, "config", None)
        if self._refresh_s is not None:
            self._refresher = asyncio.create_task(self._refresh_loop(self._refresh_s))

    async def stop(self) -> None:
        if self._refresher is not None:
            await cancel_and_wait(self._refresher)
            self._refresher = None

    def settings(self, kind: str) -> KindSettings:
        """The kind's settings as this instance knows them (none: no limits)."""
        return self._known.get(kind) or KindSettings(kind=kind)

    def known(self) -> list[KindSettings]:
        return list(self._known.values())

    async def update(self, kind: str, changes: dict[str, Any], actor: ActorRef, request_id: str | None) -> KindSettings:
        """Apply ``changes`` (fields of ``FIELDS``) to the stored settings; audited, evented, offered by. A value
        out of its bounds (``model/kind_limits.py``) is refused 400 INVALID_ARGUMENT and nothing is written."""
        check_changes(changes)  # every way in (API, console, gatewayctl) meets the same bounds here
        lock = self._locks.setdefault(kind, asyncio.Lock())
        async with lock:  # one change at a time per kind on this instance (fewer lost races, not the guard)
            for _ in range(MAX_TRIES):
                stored = await self._store.read_kind(kind)
                current = stored.settings if stored is not None else KindSettings(kind=kind)
                new = msgspec.structs.replace(current, **changes, updated_at=self._clock())
                version = None if stored is None else stored.version
                if await self._write(new, actor, request_id, "api", version, before=current):
                    return new
        raise Conflict(
            f"the settings of kind {kind} kept changing under this change; try again",
            code=Code.REVISION_CONFLICT,
            details={"kind": kind},
        )

    async def _write(
        self,
        new: KindSettings,
        actor: ActorRef,
        request_id: str | None,
        source: str,
        expected: bytes | None,
        before: KindSettings | None = None,
    ) -> bool:
        """Write ``new`` over the stored document ``expected`` (None: where no row is); False when another write
        committed since that read (nothing written)."""
        now = self._clock()
        data = msgspec.to_builtins(new)
        changed = sorted(f for f in FIELDS if before is None or getattr(before, f) != getattr(new, f))
        audit = AuditEntry(
            id=idgen.new_id("aud"),
            at=now,
            action="kind.update",
            object_type="kind",
            object_id=new.kind,
            result="ok",
            actor=actor,
            request_id=request_id,
            details={"settings": data, "changed": changed, "source": source},
        )
        event = EventRecord(
            id=idgen.new_id("evt"),
            type="kind.updated",
            aggregate_type="kind",
            aggregate_id=new.kind,
            owner=None,
            revision=None,
            at=now,
            request_id=request_id,
            data={"settings": data, "changed": changed},
        )
        if not await self._store.swap_kind(new, audit, event, expected):
            return False
        if self._on_committed is not None:
            self._on_committed()
        self._take(new)
        return True

    def _take(self, settings: KindSettings) -> None:
        if self._known.get(settings.kind) != settings:
            self._known[settings.kind] = settings
            self._sink(settings)

    async def _load(self) -> None:
        for s in await self._store.list_kinds():
            self._take(s)

    async def _refresh_loop(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._load()
            except Exception as exc:  # the store is away: the claims' own check still holds every limit
                log.warning("kinds: could not read the settings (%s); retrying", type(exc).__name__)
