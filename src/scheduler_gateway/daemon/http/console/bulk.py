"""What a bulk cancel / retry confirmed: the exact tasks (id and revision) the confirmation page named, kept in
the daemon's memory under a random confirmation id that only the session it was shown to can use, once, before
it expires. The action then acts on those tasks alone, each guarded by its revision, so a task created or
changed after the confirmation is never touched (docs/CONSOLE.md, Bulk actions).

In memory, like the sessions themselves (a restart signs everyone out, so it also forgets every confirmation);
bounded: a few per session, a cap on the tasks one names and on the tasks all of them hold together."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import InvalidArgument

CONFIRM_TTL_S = 10 * 60
PER_SESSION = 4  # a session's latest confirmations (several tabs); an older one is forgotten
MAX_CONFIRMATIONS = 2_000
MAX_TASKS = 100_000  # one confirmation names at most this many tasks (narrow the filter beyond)
MAX_HELD_TASKS = 500_000  # task ids held by every confirmation together; the oldest go first


class Confirmation(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    session_id: str
    action: str
    filter_args: dict[str, str]
    tasks: dict[str, int]  # task id -> the revision the confirmation saw
    expires_at: float


class Confirmations:
    def __init__(self, ttl_s: float = CONFIRM_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_id: dict[str, Confirmation] = {}  # insertion order: oldest first

    def create(self, session_id: str, action: str, filter_args: dict[str, str], tasks: dict[str, int]) -> str:
        if len(tasks) > MAX_TASKS:
            raise InvalidArgument(
                f"a bulk action takes at most {MAX_TASKS} tasks at once ({len(tasks)} match): narrow the filter"
            )
        now = self._clock()
        self._by_id = {k: c for k, c in self._by_id.items() if c.expires_at > now}
        mine = [k for k, c in self._by_id.items() if c.session_id == session_id]
        for k in mine[: max(0, len(mine) - PER_SESSION + 1)]:
            del self._by_id[k]
        held = sum(len(c.tasks) for c in self._by_id.values())
        while self._by_id and (len(self._by_id) >= MAX_CONFIRMATIONS or held + len(tasks) > MAX_HELD_TASKS):
            held -= len(self._by_id.pop(next(iter(self._by_id))).tasks)
        c = Confirmation(
            id=secrets.token_urlsafe(24),
            session_id=session_id,
            action=action,
            filter_args=dict(filter_args),
            tasks=dict(tasks),
            expires_at=now + self.ttl_s,
        )
        self._by_id[c.id] = c
        return c.id

    def take(self, session_id: str, confirmation_id: str, action: str) -> Confirmation | None:
        """The confirmation, used up; None when it is unknown, expired, another session's or another action's
        (and then it stays for its own session)."""
        c = self._by_id.get(confirmation_id)
        if c is None or c.session_id != session_id or c.action != action:
            return None
        del self._by_id[confirmation_id]
        return c if c.expires_at > self._clock() else None


def bulk_op(form: Mapping[str, Any], actions: tuple[str, ...]) -> tuple[str, str]:
    """The action a bulk form asks for and its scope ("" when the form does not say): a button of the list sends
    ``op=<action>:<scope>``, the confirmation page ``action=<action>``. 400 for an action not in ``actions``."""
    op = str(form.get("op", ""))
    action, _, scope = op.partition(":") if op else (str(form.get("action", "")), "", "")
    if action not in actions:
        raise InvalidArgument("unknown bulk action", details={"field": "action"})
    return action, scope


class BulkTally:
    """What a confirmed bulk action did: ``done``, ``skipped`` (the object changed since the confirmation, or is
    gone) and ``refused`` (by error code, in ``refused_codes``)."""

    def __init__(self) -> None:
        self.done = 0
        self.skipped = 0
        self.refused = 0
        self.refused_codes: dict[str, int] = {}

    def refuse(self, code: str) -> None:
        self.refused += 1
        self.refused_codes[code] = self.refused_codes.get(code, 0) + 1
