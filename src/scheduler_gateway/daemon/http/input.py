"""What the admin API accepts on the way in, checked before anything parses it (docs/CONFIG.md, "HTTP input
limits"): the body's ``Content-Encoding``, its size once decoded, its JSON nesting depth, and the request
headers the API reads (the bearer token, ``Idempotency-Key``).

Each check raises a ``GatewayError`` (400 INVALID_ARGUMENT, 413 PAYLOAD_TOO_LARGE, 401 UNAUTHENTICATED), so a
malformed request gets the error envelope like any other refusal, never a 500.
"""

from __future__ import annotations

import re
import zlib

from scheduler_gateway.wire.errors import InvalidArgument, PayloadTooLarge

# A request body nested deeper than this (arrays and objects, the body itself being level 1) is refused
# before it is decoded. msgspec decodes recursively and raises RecursionError somewhere near Python's
# recursion limit (about 1000 levels, less the handler's own stack): a limit of our own keeps the answer
# the same wherever the request lands, and far from that edge.
MAX_JSON_DEPTH = 64
MAX_IDEMPOTENCY_KEY = 255
CONTENT_CODINGS = ("gzip", "x-gzip", "deflate")

# A JSON string (with its escapes), whose brackets are text, not nesting.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_AS_PARENS = bytes.maketrans(b"[]{}", b"()()")


def decode_content(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """The body as sent, undone from its ``Content-Encoding`` (gzip or deflate; identity or none passes as is).

    aiohttp's own decompression is off (``auto_decompress=False``): it raised ``zlib.error`` into the handler
    for a body that was not what its header said, or answered a plain-text 400 from the parser. Here a body
    that does not decode is a 400, and one that decodes to more than ``limit`` bytes a 413, found without
    inflating more than ``limit + 1`` bytes (a small gzip bomb costs nothing).
    """
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return raw
    if len(codings) > 1 or codings[0] not in CONTENT_CODINGS:
        raise InvalidArgument(
            f"Content-Encoding {content_encoding[:40]!r} is not supported: send gzip, deflate or identity",
            details={"header": "Content-Encoding"},
        )
    if not raw:
        return raw
    coding = codings[0]
    if coding == "deflate":
        # RFC 9110 deflate is the zlib format; a raw deflate stream (no zlib header) is sent by enough
        # clients that aiohttp accepts it too
        wbits = zlib.MAX_WBITS if raw[0] & 0x0F == 8 else -zlib.MAX_WBITS
    else:
        wbits = 16 + zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        body = inflater.decompress(raw, limit + 1)
        valid = inflater.eof and not inflater.unused_data  # complete, and nothing after the end
    except zlib.error:
        body, valid = b"", False
    if len(body) > limit:
        raise PayloadTooLarge(
            f"the body is over {limit} bytes once decoded (Content-Encoding: {coding})", details={"limit": limit}
        )
    if not valid:
        raise InvalidArgument(
            f"the body is not valid {coding} data (Content-Encoding: {coding})",
            details={"header": "Content-Encoding"},
        )
    return body


def check_json_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """400 when ``body`` nests arrays and objects deeper than ``limit``, found without recursing.

    Most bodies have fewer brackets than the limit and cost two counts. Otherwise strings are cut out,
    the brackets kept, and every innermost ``()`` pair removed once per level: a body ``limit`` deep is
    empty after ``limit`` rounds, one deeper still has a pair left (a run of ``limit + 1`` openers ends it at
    once: the usual deep body costs one round). Unbalanced brackets are left for the decoder to call malformed.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return
    skeleton = _JSON_STRING.sub(b"", body).translate(_AS_PARENS, _NOT_BRACKETS)
    too_deep = b"(" * (limit + 1)  # a run of openers this long is too deep whatever follows
    for _ in range(limit):
        if too_deep in skeleton:
            break
        shorter = skeleton.replace(b"()", b"")
        if len(shorter) == len(skeleton):
            return
        skeleton = shorter
    if too_deep in skeleton or b"()" in skeleton:
        raise InvalidArgument(
            f"the body is nested deeper than {limit} levels of arrays and objects", details={"maxDepth": limit}
        )


def idempotency_key(raw: str | None) -> str | None:
    """The ``Idempotency-Key`` header: absent, or 1 to 255 printable ASCII characters (else 400)."""
    if raw is None:
        return None
    if not (0 < len(raw) <= MAX_IDEMPOTENCY_KEY and raw.isascii() and raw.isprintable()):
        raise InvalidArgument(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters",
            details={"header": "Idempotency-Key", "maxLength": MAX_IDEMPOTENCY_KEY},
        )
    return raw


def bearer_token_text(token: str) -> bool:
    """Whether ``token`` can be a token at all. aiohttp hands header bytes that are not UTF-8 over as lone
    surrogates, which ``str.encode()`` refuses: such a token is simply not valid (401), never hashed."""
    return token.isascii() and token.isprintable()
