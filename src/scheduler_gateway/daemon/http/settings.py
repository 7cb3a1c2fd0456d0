"""The admin API's settings from ``[http]`` (docs/CONFIG.md): the payload limit and what a create may ask of a
callback. A leaf module, so the app, its route groups and the console read them without importing each other."""

from __future__ import annotations

import msgspec

#: A request body may be this much larger than ``max_payload_bytes``: the payload is one field of the body, and
#: the fields around it (kind, labels, ...) need their room too.
BODY_HEADROOM = 64 * 1024


class HttpSettings(msgspec.Struct, frozen=True, kw_only=True):
    max_payload_bytes: int = 1048576
    callback_secret_configured: bool = False
    allow_private_networks: bool = True

    @property
    def max_body_bytes(self) -> int:
        """The largest request body the app reads (aiohttp's ``client_max_size``)."""
        return self.max_payload_bytes + BODY_HEADROOM
