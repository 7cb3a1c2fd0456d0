"""Which store a gatewayd uses: ``[store] url`` (``GW_STORE_URL``) names it (CONTRACT section 1). Parsing only,
no driver imported (``select.open_store`` opens the store).

- ``sqlite:///<path>``: the SQLite store on that file (the path after the third slash, so an absolute path
  shows four: ``sqlite:////var/lib/gw/gateway.db``; a relative one is resolved at load time). The default,
  ``sqlite:///<data_dir>/gateway.db``, is the embedded store of one instance.
- ``postgresql://user:pass@host:port/db`` (or ``postgres://``): the PostgreSQL store, which several gatewayd
  may share (CONTRACT section 4). Everything after the scheme is libpq's (query parameters such as
  ``sslmode`` included).

The URL may carry a password: only ``redact_one_url`` of it is ever printed, here and by the callers. A
PostgreSQL URL must percent-encode the reserved characters of its user name and password, its spaces and any
``@`` elsewhere: written raw, libpq reads the URL differently from us, or refuses it, and quotes the pieces it
misread (a part of the password, or the whole URL) in its errors, which the connection pool logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from scheduler_gateway.wire.errors import Fault
from scheduler_gateway.wire.redact import redact_one_url

StoreKind = Literal["sqlite", "postgresql"]

SQLITE_PREFIX = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql", "postgres")
# a "%" that is no %XX escape, or the %00 libpq refuses: libpq's error would quote the token around it
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})|%00")
# an IPv6 host's "]" followed by anything but a port or the next host: libpq's error would quote the whole URL
_BAD_BRACKET = re.compile(r"\](?![:,]|\Z)")


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A parsed ``[store] url``: the kind, the SQLite file (sqlite only) and the URL itself."""

    kind: StoreKind
    url: str
    path: Path | None = None

    @property
    def redacted(self) -> str:
        return redact_one_url(self.url)

    def __repr__(self) -> str:
        return f"StoreLocation(kind={self.kind!r}, url={self.redacted!r})"


class StoreUrlError(Fault, ValueError):
    """The URL names no store we know; the message never contains the URL's secrets."""


def sqlite_url(path: Path) -> str:
    return SQLITE_PREFIX + str(path)


def parse_store_url(url: str) -> StoreLocation:
    text = url.strip()
    if text.startswith(SQLITE_PREFIX):
        rest = text[len(SQLITE_PREFIX) :]
        if rest == "" or "\x00" in rest or "?" in rest:
            raise StoreUrlError("must name a file: sqlite:///<path>")
        return StoreLocation(
            "sqlite", sqlite_url(Path(rest).expanduser().absolute()), Path(rest).expanduser().absolute()
        )
    try:
        parts = urlsplit(text)
    except ValueError:
        raise StoreUrlError("is not a URL") from None
    if parts.scheme.lower() in POSTGRES_SCHEMES:
        text = parts.scheme.lower() + text[len(parts.scheme) :]  # libpq knows its schemes in lower case only
        _refuse_what_libpq_reads_otherwise(text, parts.netloc)
        if not parts.hostname and "host=" not in parts.query:
            raise StoreUrlError("must name a host: postgresql://user:pass@host:port/db")
        if not parts.path.strip("/"):
            raise StoreUrlError("must name a database: postgresql://user:pass@host:port/db")
        try:
            parts.port  # noqa: B018 - a bad port raises here
        except ValueError:
            raise StoreUrlError("has a port that is not a number in 1-65535") from None
        return StoreLocation("postgresql", text)
    if parts.scheme.lower() == "sqlite":
        raise StoreUrlError("must be sqlite:///<path> (three slashes before the path)")
    raise StoreUrlError("must start with sqlite:/// or postgresql://")


def _refuse_what_libpq_reads_otherwise(text: str, netloc: str) -> None:
    """Refuse a PostgreSQL URL that libpq would read differently from ``urlsplit`` (and so from
    ``redact_one_url``) or refuse with an error quoting a piece of it: that piece may be the password, and
    the connection pool logs libpq's errors. A raw ``@ / ? #`` in the password moves where it ends, a bad
    %-escape or a space is quoted back, and a URL libpq does not take for one is quoted whole."""
    if not text.startswith(tuple(f"{scheme}://" for scheme in POSTGRES_SCHEMES)):
        raise StoreUrlError("must start with postgresql:// (two slashes)")
    if text.count("@") > 1 or ("@" in text and "@" not in netloc):
        raise StoreUrlError(
            "must percent-encode the user name and password (@ as %40, / as %2F, ? as %3F, # as %23,"
            " % as %25) and any @ in the database or parameters"
        )
    if _BAD_ESCAPE.search(text):
        raise StoreUrlError("has a % that is no %XX escape (or is %00): write a % itself as %25")
    if any(c.isspace() for c in text):
        raise StoreUrlError("must percent-encode its spaces (as %20)")
    if _BAD_BRACKET.search(netloc.rpartition("@")[2]):
        raise StoreUrlError("has a character after an IPv6 address that is no :port")
