"""The one way a URL with credentials in it is made printable: logs, errors, ``gatewayd check``, API views.

Used by the daemon (config, check, callback dead letters) and by the worker SDK, which imports ``wire`` only,
hence here: a pure string function, no IO.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit, urlunsplit

#: What a secret is replaced with.
REDACTED: Final = "***"

# Query parameter names whose values are secrets (matched anywhere in the name, case-insensitively):
# ``?token=``, ``?access_token=``, ``?api_key=``, ``?password=``, ``?X-Amz-Signature=``, ``?sig=``, ``?jwt=``...
_SECRET_PARAM: Final = re.compile(
    r"pass|pwd|secret|token|key|auth|sig|credential|jwt|nkey|session|cookie", re.IGNORECASE
)


def redact_url(url: str) -> str:
    """``url`` (one, or a comma-separated server list) with every secret in it replaced by ``***``.

    - ``nats://user:pw@host`` -> ``nats://user:***@host`` (the user name stays: it says who connects);
    - ``nats://TOKEN@host`` -> ``nats://***@host``: NATS reads a userinfo without a colon as a token;
    - ``https://h/p?token=abc&x=1`` -> ``https://h/p?token=***&x=1`` for parameters named like a secret.

    Never raises: a part that does not parse as a URL is shown as ``<unparsable url>``.
    """
    return ",".join(_redact_one(one.strip()) for one in url.split(","))


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    netloc, query = parts.netloc, parts.query
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{hostport}" if colon else f"{REDACTED}@{hostport}"
    if query:
        query = "&".join(_redact_param(p) for p in query.split("&"))
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # nothing secret: exactly as given
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _redact_param(param: str) -> str:
    name, eq, value = param.partition("=")
    if eq and value and _SECRET_PARAM.search(name):
        return f"{name}={REDACTED}"
    return param
