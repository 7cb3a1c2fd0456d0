"""Names that become NATS subject tokens or JetStream consumer names (docs/WIRE.md, Names): kinds, node ids and
the subject prefix, with the one check every door uses (HTTP bodies and paths, config, the worker SDK, the
gateway's own subjects).

A kind is 1 to 64 characters of ``[a-z0-9_.-]`` in non-empty parts separated by single dots (CONTRACT 2.1): it
names the subject ``gw.dispatch.<kind>``, where NATS refuses an empty token, and the consumer ``gw-kind-<kind>``.
A node id is one subject token. Every pattern here matches the whole string (``\\A...\\Z``): ``$`` would also
match before a final newline, and a newline in a subject breaks the NATS protocol line it is sent in.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from msgspec import Meta

KIND_MAX: Final = 64
#: a kind: non-empty dot-separated parts of [a-z0-9_-], 1 to 64 characters in all
KIND_PATTERN: Final = r"\A(?=[a-z0-9_.-]{1,64}\Z)[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z"
#: a kind's shape without its length (bodies give the length as min/max length: a JSON Schema generator, the
#: OpenAPI fuzzer's, handles that better than a lookahead)
KIND_SHAPE: Final = r"\A[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z"
#: a node id: one subject token of [A-Za-z0-9_-], 1 to 64 characters
NODE_ID_PATTERN: Final = r"\A[A-Za-z0-9_-]{1,64}\Z"
#: the subject prefix (``[nats] subject_prefix``): non-empty dot-separated tokens of [A-Za-z0-9_-]
SUBJECT_PREFIX_PATTERN: Final = r"\A(?=[A-Za-z0-9_.-]{1,64}\Z)[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\Z"

KIND_RULE: Final = "a kind is 1 to 64 of a-z 0-9 _ - in non-empty parts separated by single dots"
NODE_ID_RULE: Final = "a node id is 1 to 64 of A-Z a-z 0-9 _ -"

_KIND: Final = re.compile(KIND_PATTERN)
_NODE_ID: Final = re.compile(NODE_ID_PATTERN)
_SUBJECT_PREFIX: Final = re.compile(SUBJECT_PREFIX_PATTERN)

#: a kind in a msgspec body: refused at decoding when it breaks the rule
KindName = Annotated[str, Meta(min_length=1, max_length=KIND_MAX, pattern=KIND_SHAPE)]
#: a node id in a msgspec body
NodeId = Annotated[str, Meta(pattern=NODE_ID_PATTERN)]


def is_kind(value: object) -> bool:
    """A kind NATS takes as a subject token sequence and a consumer name (CONTRACT 2.1)."""
    return isinstance(value, str) and _KIND.fullmatch(value) is not None


def is_node_id(value: object) -> bool:
    return isinstance(value, str) and _NODE_ID.fullmatch(value) is not None


def is_subject_prefix(value: object) -> bool:
    return isinstance(value, str) and _SUBJECT_PREFIX.fullmatch(value) is not None


def ecma_pattern(pattern: str) -> str:
    """The pattern as a JSON Schema (ECMA-262) regex: ``\\A`` and ``\\Z`` are not ECMA; there ``^`` and ``$``
    (without the multiline flag) anchor at the very start and end, so they mean the same."""
    if pattern.startswith("\\A"):
        pattern = "^" + pattern[2:]
    if pattern.endswith("\\Z"):
        pattern = pattern[:-2] + "$"
    return pattern.replace("\\Z)", "$)")
