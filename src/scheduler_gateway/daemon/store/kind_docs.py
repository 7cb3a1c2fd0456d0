"""A kind's stored settings document, read by both stores (docs/FLOW.md, "Settings that do not decode").

A document written before the settings were bounded (a rate period of ``inf`` stored as ``null``), or edited by
hand, may not decode whole. Reading it must neither block the repair (``PUT {"rate": null}``), nor the claims of
other kinds committed in the same batch, nor a ``GET``: such a document is read field by field, and a field
that does not decode is read as no limit (logged with the kind and the field's name, never the document). The
next change of the kind writes the whole document again.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from scheduler_gateway.actors.model.flow import KindSettings

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder(KindSettings).decode
_decode_any = msgspec.json.Decoder().decode
_FIELDS = {f.name: f.type for f in msgspec.structs.fields(KindSettings) if f.name != "kind"}


def read_kind_doc(kind: str, doc: Any) -> KindSettings:
    """The settings a stored document holds; never raises (see the module doc)."""
    raw = bytes(doc)
    try:
        s = _decode(raw)
    except (msgspec.DecodeError, TypeError):
        pass
    else:
        return s if s.kind == kind else msgspec.structs.replace(s, kind=kind)
    try:
        fields = _decode_any(raw)
    except msgspec.DecodeError:
        fields = None
    if not isinstance(fields, dict):
        log.warning("kinds: the stored settings of kind %s are not a JSON object; read as no settings", kind)
        return KindSettings(kind=kind)
    values: dict[str, Any] = {}
    bad: list[str] = []
    for name, typ in _FIELDS.items():
        if name not in fields:
            continue
        try:
            values[name] = msgspec.convert(fields[name], typ)
        except msgspec.ValidationError:
            bad.append(name)
    log.warning(
        "kinds: stored settings of kind %s do not decode in %s; read as no limit there until the next change",
        kind,
        ", ".join(bad) or "their shape",
    )
    return KindSettings(kind=kind, **values)
