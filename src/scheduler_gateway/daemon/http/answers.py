"""The admin API's answers: a value as a JSON response. Errors have their envelope in ``errors.py``; streamed
answers (artifacts, events) are built by their routes."""

from __future__ import annotations

import msgspec
from aiohttp import web

# one encoder for the process: msgspec's Encoder reuses its buffer; every handler runs on the event loop's thread
_ENCODER = msgspec.json.Encoder()


def json_response(value: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """``value`` encoded by msgspec (wire structs rename their fields to camelCase) as ``application/json``."""
    return web.Response(body=_ENCODER.encode(value), status=status, content_type="application/json", headers=headers)
