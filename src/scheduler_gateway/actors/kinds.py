"""Kinds as objects (docs/FLOW.md): each kind's flow settings, kept in the store, audited, announced as
``kind.updated`` events, and handed to the dispatcher, which offers by them.

The store's check at claim time is what holds the limits exactly; this service only keeps the dispatcher's
copy current: on every change made here, and (several instances) by reading the store's settings every
``refresh_s``, so a change made on another instance reaches this one's dispatcher within that time. A write's
``kind.updated`` event is in the outbox when ``put_kind`` returns; ``on_committed`` (the event relay's wake-up,
as for task changes) moves it to the stream at once instead of at the relay's next idle poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from . import idgen
from .model.flow import KindSettings
from .model.records import SYSTEM, ActorRef, AuditEntry, EventRecord
from .ports import KindStore
from .runtime import cancel_and_wait

log = logging.getLogger(__name__)

REFRESH_S = 1.0
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
                await self._write(msgspec.structs.replace(d, updated_at=self._clock()), SYSTEM, None, "config")
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
        """Apply ``changes`` (fields of ``FIELDS``) to the stored settings; audited, evented, offered by."""
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise ValueError(f"not a kind setting: {sorted(unknown)}")
        lock = self._locks.setdefault(kind, asyncio.Lock())
        async with lock:  # one read-modify-write at a time per kind on this instance
            current = await self._store.get_kind(kind) or KindSettings(kind=kind)
            new = msgspec.structs.replace(current, **changes, updated_at=self._clock())
            await self._write(new, actor, request_id, "api", before=current)
        return new

    async def _write(
        self,
        new: KindSettings,
        actor: ActorRef,
        request_id: str | None,
        source: str,
        before: KindSettings | None = None,
    ) -> None:
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
        await self._store.put_kind(new, audit, event)
        if self._on_committed is not None:
            self._on_committed()
        self._take(new)

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
