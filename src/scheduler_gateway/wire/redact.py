"""The one way a URL with credentials in it is made printable: logs, errors, ``gatewayd check``, API views.

Used by the daemon (config, check, callback dead letters) and by the worker SDK, which imports ``wire`` only,
hence here: a pure string function, no IO.

Whatever characters a secret has, it is not printed. A password written raw (``,``, ``@``, ``/``, ``?``, ``#``
unencoded) makes the URL ambiguous, so the userinfo is taken as everything between ``scheme://`` and the
LAST ``@`` of the URL: always at least the real userinfo. The price is that a URL with an ``@`` in its path or
query (``https://h/u/me@x``) is shown with more hidden than needed (``https://***@x``), never less.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import unquote, urlsplit

#: What a secret is replaced with.
REDACTED: Final = "***"
#: What a URL that does not parse is shown as.
UNPARSABLE: Final = "<unparsable url>"

# Query parameter names whose values are secrets (matched anywhere in the name, case-insensitively):
# ``?token=``, ``?access_token=``, ``?api_key=``, ``?password=``, ``?X-Amz-Signature=``, ``?sig=``, ``?jwt=``...
_SECRET_PARAM: Final = re.compile(
    r"pass|pwd|secret|token|key|auth|sig|credential|jwt|nkey|session|cookie", re.IGNORECASE
)
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# In a server list, a comma starts a new server only when a ``scheme://`` follows it: a comma in a password does not.
_NEXT_SERVER: Final = re.compile(r",(?=\s*[A-Za-z][A-Za-z0-9+.\-]*://)")
# Schemes whose URLs name a file and never carry credentials: an ``@`` in their path is not a userinfo.
_PATH_SCHEMES: Final = frozenset({"sqlite", "file"})
# A user name with one of these is not one (the userinfo reached past the authority): it is hidden too.
_NOT_IN_A_USER: Final = re.compile(r"[@/?#]")


def redact_url(url: str) -> str:
    """``url`` (one, or a NATS server list ``nats://a:4222,nats://b:4222``) with every secret in it replaced by
    ``***``; each server of a list is redacted on its own (``redact_one_url``).

    The list is split only at a comma followed by a new ``scheme://``, so a comma in a password is no split
    point. A URL that is never a list (a store URL, a callback URL) is better given to ``redact_one_url``.
    """
    return ",".join(redact_one_url(one) for one in _NEXT_SERVER.split(url))


def redact_one_url(url: str) -> str:
    """One ``url`` (commas are not split at) with every secret in it replaced by ``***``:

    - ``postgresql://user:pw@host/db`` -> ``postgresql://user:***@host/db`` (the user name stays: it says who
      connects), whatever the password holds (``pa,ss``, ``p@ss``, ``p/ss``, ``%``-escapes, unicode);
    - ``nats://TOKEN@host`` -> ``nats://***@host``: NATS reads a userinfo without a colon as a token;
    - ``https://h/p?token=abc&x=1`` -> ``https://h/p?token=***&x=1`` for parameters named like a secret.

    Never raises: a URL that does not parse is shown as ``<unparsable url>``.
    """
    head, user, secret, rest = _split_userinfo(url.strip())
    if secret is not None:
        rest = f"{user}:{REDACTED}@{rest}" if user is not None else f"{REDACTED}@{rest}"
    before, mark, query = rest.partition("?")
    if mark:
        query, hash_, fragment = query.partition("#")
        query = "&".join(_redact_param(p) for p in query.split("&"))
        rest = f"{before}?{query}{hash_}{fragment}"
    shown = head + rest
    try:
        urlsplit(shown)
    except ValueError:
        return UNPARSABLE
    return shown


def url_secrets(url: str) -> list[str]:
    """The secrets ``redact_one_url`` hides in ``url``, each as written and percent-decoded: what to scrub from
    a third-party message that may quote a piece of the URL (libpq does)."""
    _, _, secret, rest = _split_userinfo(url.strip())
    found = [] if secret is None else [secret]
    query = rest.partition("?")[2].partition("#")[0]
    for param in query.split("&") if query else ():
        name, eq, value = param.partition("=")
        if eq and value and _SECRET_PARAM.search(name):
            found.append(value)
    return sorted({form for s in found for form in (s, unquote(s)) if form}, key=len, reverse=True)


def _split_userinfo(text: str) -> tuple[str, str | None, str | None, str]:
    """``(scheme://, user kept, secret, the rest after the userinfo's @)``; secret None: no userinfo. The user is
    None when the whole userinfo is the secret: a token, or a "user name" that reached past the authority."""
    found = _SCHEME.match(text)
    head, rest = (text[: found.end()], text[found.end() :]) if found else ("", text)
    if head[:-3].lower() in _PATH_SCHEMES:
        return head, None, None, rest
    userinfo, at, after = rest.rpartition("@")
    if not at:
        return head, None, None, rest
    user, colon, password = userinfo.partition(":")
    if colon and not _NOT_IN_A_USER.search(user):
        return head, user, password, after
    return head, None, userinfo, after


def _redact_param(param: str) -> str:
    name, eq, value = param.partition("=")
    if eq and value and _SECRET_PARAM.search(name):
        return f"{name}={REDACTED}"
    return param


#: Field names that hold a secret, in the project's Structs (a callback's signing secret, a password, a token)
SECRET_FIELD: Final = re.compile(r"secret|password|passwd|token", re.IGNORECASE)


def redacted_repr(self: Any) -> str:
    """``repr`` (and so ``str``) of a msgspec Struct with every secret-named field shown as ``***``: assign it as
    the class's ``__repr__``. Encoding is untouched: the secret still goes where it is meant to go."""
    parts = []
    for name in self.__struct_fields__:
        value = getattr(self, name)
        shown = REDACTED if value is not None and SECRET_FIELD.search(name) else repr(value)
        parts.append(f"{name}={shown}")
    return f"{type(self).__name__}({', '.join(parts)})"
