"""The kinds API's bodies and views (docs/API.md, Kinds; docs/FLOW.md): a kind's flow settings and counts."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, UnsetType

MAX_LIMIT = 1_000_000
MAX_PERIOD_S = 366 * 86400.0


class RateBody(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)]
    period_seconds: Annotated[float, Meta(gt=0, le=MAX_PERIOD_S)]


class UpdateKindBody(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """``PUT /api/kinds/{kind}``: a field left out is unchanged, ``null`` removes the limit."""

    paused: bool | UnsetType = UNSET
    concurrency: Annotated[int, Meta(ge=0, le=MAX_LIMIT)] | UnsetType | None = UNSET
    key_concurrency: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] | UnsetType | None = UNSET
    rate: RateBody | UnsetType | None = UNSET
    key_rate: RateBody | UnsetType | None = UNSET


class RateView(msgspec.Struct, rename="camel", kw_only=True):
    limit: int
    period_seconds: float


class KindCountsView(msgspec.Struct, rename="camel", kw_only=True):
    queued: int = 0
    running: int = 0
    waiting_approval: int = 0


class KindView(msgspec.Struct, rename="camel", kw_only=True):
    kind: str
    paused: bool
    concurrency: int | None
    key_concurrency: int | None
    rate: RateView | None
    key_rate: RateView | None
    counts: KindCountsView
    updated_at: str | None
    #: nodes serving the kind (a heartbeat naming it in the last 60 s, not draining); 0: no node runs its tasks
    online_nodes: int = 0


class KindList(msgspec.Struct, rename="camel", kw_only=True):
    """``GET /api/kinds``: a page of kinds by name (CONTRACT 2 lists); ``nextCursor`` null on the last page."""

    items: list[KindView]
    next_cursor: str | None = None
