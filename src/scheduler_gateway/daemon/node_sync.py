"""The node registry kept in line with the store, as a service: loaded at start, flushed every ``NODE_FLUSH_S``
(this instance's changes written, what other instances wrote merged in), flushed once more at stop.

Its loop also reads the outbox's size for the ``gw_outbox_backlog`` gauge and /readyz.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.runtime import cancel_and_wait
from scheduler_gateway.actors.store_ports import NodeStore, OutboxStore
from scheduler_gateway.wire.errors import GatewayError

log = logging.getLogger(__name__)

NODE_FLUSH_S = 2.0


class NodeSyncStore(Protocol):
    """The node records it loads and flushes, and the outbox's size it samples."""

    @property
    def nodes(self) -> NodeStore: ...
    @property
    def tasks(self) -> OutboxStore: ...


class NodeSync:
    def __init__(self, nodes: NodeRegistry, store: NodeSyncStore, *, interval_s: float | None = None) -> None:
        self._nodes = nodes
        self._store = store
        self._interval_s = NODE_FLUSH_S if interval_s is None else interval_s  # read at construction (tests shorten it)
        self._loop: asyncio.Task[None] | None = None
        #: events written but not yet relayed, as of the last round
        self.outbox_backlog = 0

    async def start(self) -> None:
        self._nodes.load(await self._store.nodes.list_nodes())
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="node-sync")

    async def stop(self) -> None:
        await self.abandon()
        with contextlib.suppress(GatewayError):
            await self._store.nodes.put_nodes(self._nodes.take_dirty())

    async def abandon(self) -> None:
        """The loop ends, nothing is written (a stop's flush aside; tests: a process that dies)."""
        if self._loop is not None:
            await cancel_and_wait(self._loop)
            self._loop = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                dirty = self._nodes.take_dirty()
                if dirty:
                    await self._store.nodes.put_nodes(dirty)
                # what other instances flushed and drained (actors/nodes.py): a drain decided on another instance
                # is refused here within a flush
                self._nodes.merge(await self._store.nodes.list_nodes())
                self.outbox_backlog = await self._store.tasks.outbox_size()
            except GatewayError as exc:
                log.warning("node registry flush failed: %s", exc.code)
