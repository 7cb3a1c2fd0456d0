"""Ids: prefixed, well formed, and strictly increasing within a process."""

from __future__ import annotations

from scheduler_gateway.actors.idgen import new_id
from scheduler_gateway.wire.ids import is_id


def test_ids_made_in_one_process_are_strictly_increasing() -> None:
    ids = [new_id("tsk") for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(is_id(i, "tsk") for i in ids[:10])
