"""The ports of the artifact service (``actors/artifacts.py``) other than the store's: ``ArtifactBucket``, where
the bytes live (in gatewayd the JetStream object store, ``daemon/nats/artifacts.py``; its keeper,
``actors/artifact_keeper.py``, sweeps it too), and ``LeaseHolder``, the task service's lease checks that every
node request passes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from .model.artifacts import ArtifactRecord
from .model.records import Task


class ArtifactBucket(Protocol):
    """The bytes (the daemon's JetStream object store adapter, daemon/nats/artifacts.py)."""

    def upload_settings(self) -> tuple[str, int]:
        """``(chunk subject template, chunk size)``: where nodes publish and how big a chunk may be."""
        ...

    def watch(self, upload: str) -> None:
        """A chunked upload was begun here: the bucket may start checking its chunks as they are stored, so that
        ``verify`` need not read them all back (an optimisation: ``verify`` is right either way)."""
        ...

    async def verify(self, upload: str, size: int, sha256: str) -> int:
        """Read the stored chunks of ``upload`` back: their count when they hold exactly ``size`` bytes with that
        sha256; else GatewayError DIGEST_MISMATCH (the chunks stay: the caller drops them)."""
        ...

    async def write_meta(self, record: ArtifactRecord) -> None:
        """Make the object ``<taskId>/<name>`` name the record's chunks (the object store's meta)."""
        ...

    async def put_chunk(self, upload: str, data: bytes) -> None:
        """Store ``data`` as the one chunk of ``upload`` (the bytes of a ``put``), acknowledged by the bucket."""
        ...

    async def remove(self, record: ArtifactRecord) -> None:
        """Remove the record's object: its meta and its chunks (nothing when already gone)."""
        ...

    async def drop_upload(self, upload: str) -> None:
        """Purge the chunks of ``upload`` (nothing when already gone)."""
        ...

    async def remove_object(self, object_name: str, upload: str) -> None:
        """Remove the meta ``object_name`` while it still names ``upload`` (an orphan object: no row names it)."""
        ...

    def upload_pages(self, page: int) -> AsyncIterator[list[tuple[str, float]]]:
        """Every upload the bucket holds chunks of, with when its newest chunk was stored, ``page`` at a time."""
        ...

    def object_pages(self, page: int) -> AsyncIterator[list[tuple[str, str, float]]]:
        """Every object the bucket holds a meta of: ``(name, the upload it names, when it was written)``, ``page``
        at a time."""
        ...

    async def last_at(self, upload: str) -> float | None:
        """When the newest chunk of ``upload`` was stored (None: it holds none)."""
        ...

    async def meta_of(self, object_name: str) -> tuple[str, float] | None:
        """The upload the meta ``object_name`` names and when it was written (None: no such meta)."""
        ...

    def read(self, record: ArtifactRecord, start: int, end: int) -> AsyncGenerator[bytes, None]:
        """The bytes ``start`` to ``end`` (inclusive) of the record's object, chunk by chunk."""
        ...


class LeaseHolder(Protocol):
    """The task service's side: the lease check, and running a step in the task's mailbox."""

    async def check_artifact_lease(self, node_id: str, task_id: str, lease_id: str) -> Task: ...
    async def under_artifact_lease(
        self, node_id: str, task_id: str, lease_id: str, fn: Callable[[Task], Awaitable[Any]]
    ) -> Any: ...
