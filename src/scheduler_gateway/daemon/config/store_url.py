"""Which store a gatewayd uses: ``[store] url`` (``GW_STORE_URL``) names it (CONTRACT section 1). Parsing only,
no driver imported (``select.open_store`` opens the store).

- ``sqlite:///<path>``: the SQLite store on that file (the path after the third slash, so an absolute path
  shows four: ``sqlite:////var/lib/gw/gateway.db``; a relative one is resolved at load time). The default,
  ``sqlite:///<data_dir>/gateway.db``, is the embedded store of one instance.
- ``postgresql://user:pass@host:port/db`` (or ``postgres://``): the PostgreSQL store, which several gatewayd
  may share (CONTRACT section 4). Everything after the scheme is libpq's (query parameters such as
  ``sslmode`` included).

The URL may carry a password: only ``redact_url`` of it is ever printed, here and by the callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from scheduler_gateway.wire.redact import redact_url

StoreKind = Literal["sqlite", "postgresql"]

SQLITE_PREFIX = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A parsed ``[store] url``: the kind, the SQLite file (sqlite only) and the URL itself."""

    kind: StoreKind
    url: str
    path: Path | None = None

    @property
    def redacted(self) -> str:
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"StoreLocation(kind={self.kind!r}, url={self.redacted!r})"


class StoreUrlError(ValueError):
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
