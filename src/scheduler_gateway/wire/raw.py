"""``NULL``, the raw JSON ``null`` the wire structs default a payload or result to: a module of its own so that the
node messages (messages.py) can carry the workflow views (workflows.py, which itself needs ``NULL``) without an
import cycle."""

from __future__ import annotations

import msgspec

NULL = msgspec.Raw(b"null")
