"""What ``gatewayd export`` leaves out: the callback secrets (``store/transfer.py``; docs/OPERATIONS.md, Moving
from SQLite to PostgreSQL). No secret ever reaches an export: a task's own ``callbackSecret`` lives in the task's
document, in its pending callback deliveries and in its callback dead letters, a workflow's in the workflow's
document (its callback's deliveries are the workflow's: task_id holds its id); the export writes those documents
without it and names the tasks it was taken from on the end line, so that import says which callbacks will be
signed with ``[callbacks] secret`` from now on (or cannot be signed, when none is configured) instead of losing
them silently.

A document is decoded into its record and encoded again with the store's own encoder, the secret set to None:
a payload inside it is ``msgspec.Raw`` and stays byte-exact, and a payload that happens to have a key named like
the secret is never touched (a text search on the bytes would)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDelivery
from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.workflows import WorkflowRecord
from scheduler_gateway.daemon.store.common import doc_decoder, encode

#: The end line's key: the ids of the tasks whose callback secret the export left out.
LEFT_OUT_KEY = "callbackSecretsLeftOut"

_task = doc_decoder(Task)
_delivery = doc_decoder(CallbackDelivery)
_dead = doc_decoder(CallbackDeadLetter)
_workflow = doc_decoder(WorkflowRecord)


def _scrub_task(doc: bytes) -> tuple[bytes, str] | None:
    t = _task(doc)
    if t.callback_secret is None:
        return None
    return encode(msgspec.structs.replace(t, callback_secret=None)), t.id


def _scrub_delivery(doc: bytes) -> tuple[bytes, str] | None:
    d = _delivery(doc)
    if d.secret is None:
        return None
    return encode(msgspec.structs.replace(d, secret=None)), d.task_id


def _scrub_dead(doc: bytes) -> tuple[bytes, str] | None:
    dl = _dead(doc)
    if dl.delivery.secret is None:
        return None
    delivery = msgspec.structs.replace(dl.delivery, secret=None)
    return encode(msgspec.structs.replace(dl, delivery=delivery)), dl.task_id


def _scrub_workflow(doc: bytes) -> tuple[bytes, str] | None:
    w = _workflow(doc)
    if w.callback_secret is None:
        return None
    return encode(msgspec.structs.replace(w, callback_secret=None)), w.id


_SCRUBBERS: dict[str, Callable[[bytes], tuple[bytes, str] | None]] = {
    "tasks": _scrub_task,
    "workflows": _scrub_workflow,  # a workflow's callback (named by the workflow's id on the end line)
    "callback_deliveries": _scrub_delivery,
    "callback_dead_letters": _scrub_dead,
}


def without_secrets(table: str, row: dict[str, Any], left_out: set[str]) -> dict[str, Any]:
    """``row`` as the export writes it: a document that holds a callback secret without it, the task's id added
    to ``left_out``. A document that does not decode is written as it is read only if it cannot hold a secret:
    one that might is refused (the export must not carry a secret it could not see)."""
    scrub = _SCRUBBERS.get(table)
    if scrub is None:
        return row
    doc = row.get("doc")
    if not isinstance(doc, bytes | memoryview):
        return row
    try:
        scrubbed = scrub(bytes(doc))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"a row of {table} does not decode, so its secrets cannot be left out") from exc
    if scrubbed is None:
        return row
    new_doc, task_id = scrubbed
    left_out.add(task_id)
    return {**row, "doc": new_doc}


def left_out_warning(task_ids: list[str], configured_secret: bool) -> str:
    """What import says about the tasks whose callback secret the export left out (empty: none)."""
    if not task_ids:
        return ""
    shown = ", ".join(task_ids[:20]) + (f" and {len(task_ids) - 20} more" if len(task_ids) > 20 else "")
    if configured_secret:
        then = "their callbacks are signed with [callbacks] secret from now on: give their receivers that secret"
    else:
        then = (
            "[callbacks] secret is not set, so their callbacks cannot be signed and will be dead-lettered: set it"
            " (and give their receivers that secret) before starting gatewayd"
        )
    return (
        f"{len(task_ids)} task(s) had their own callbackSecret, which an export never carries; {then}. Tasks: {shown}"
    )
