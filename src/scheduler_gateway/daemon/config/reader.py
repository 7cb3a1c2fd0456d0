"""Reading one value: the TOML table, its ``GW_*`` override, the typed accessors that record every problem
and fall back to the default."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler_gateway.daemon.config.model import _ENV_OF, NATS_URL_SCHEMES, SECRET_KEYS
from scheduler_gateway.daemon.config.production import _split_url_password
from scheduler_gateway.wire.redact import redact_url

_MISSING: Any = object()


def _type_name(value: object) -> str:
    """The TOML type of ``value`` with its article, for "must be ..., not <this>"."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # TOML dates and times


class _Reader:
    """Holds the parsed TOML, the environment and the list of problems found so far."""

    def __init__(self, raw: dict[str, Any], env: Mapping[str, str]) -> None:
        self.raw = raw
        self.env = env
        self.errors: list[str] = []

    def section(self, dotted: str) -> _Section:
        table: Any = self.raw
        for part in dotted.split(".") if dotted else []:
            if not isinstance(table, dict):
                table = {}  # the parent table is not a table: reported once, for the parent
                break
            table = table.get(part, {})
        if not isinstance(table, dict):
            self.errors.append(f"[{dotted}] must be a table, not {_type_name(table)}")
            table = {}
        return _Section(self, dotted, table)


class _Section:
    """One TOML table: typed accessors that record problems and fall back to the default."""

    def __init__(self, reader: _Reader, name: str, table: dict[str, Any]) -> None:
        self.reader = reader
        self.name = name
        self.table = table
        self.seen: set[str] = set()

    # -- plumbing

    def _key(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def _label(self, key: str, from_env: bool) -> str:
        dotted = self._key(key)
        return f"{dotted} ({_ENV_OF[dotted]})" if from_env else dotted

    def _error(self, key: str, from_env: bool, message: str) -> None:
        self.reader.errors.append(f"{self._label(key, from_env)} {message}")

    def _show(self, key: str, value: object) -> str:
        """The value for an error message: never the value of a secret key."""
        return "" if self._key(key) in SECRET_KEYS else f" {value!r}"

    def _raw(self, key: str) -> tuple[Any, bool]:
        """(value, from_env): the environment wins over the file; ``_MISSING`` when neither has it."""
        self.seen.add(key)
        dotted = self._key(key)
        var = _ENV_OF.get(dotted)
        if var is not None and var in self.reader.env:
            text = self.reader.env[var]
            # An empty secret is a secret given empty (production refuses it); elsewhere empty = unset.
            if text != "" or dotted in SECRET_KEYS:
                return text, True
        return self.table.get(key, _MISSING), False

    def finish(self, subsections: tuple[str, ...] = ()) -> None:
        for key, value in self.table.items():
            if key in subsections:
                continue
            if key in self.seen:
                continue
            if isinstance(value, dict):
                self.reader.errors.append(f"unknown section [{self._key(key)}]")
            else:
                self.reader.errors.append(f"unknown key {self._key(key)}")

    # -- typed accessors

    def integer(self, key: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        if from_env:
            try:
                value = int(value.strip())
            except ValueError:
                self._error(key, True, f"must be an integer, got{self._show(key, value)}")
                return default
        if isinstance(value, bool) or not isinstance(value, int):
            self._error(key, from_env, f"must be an integer, not {_type_name(value)}")
            return default
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            self._error(key, from_env, f"must be {bounds}, got{self._show(key, value)}")
            return default
        return value

    def _to_number(self, key: str, value: Any, from_env: bool) -> float | None:
        if from_env:
            try:
                value = float(value.strip())
            except ValueError:
                self._error(key, True, f"must be a number, got{self._show(key, value)}")
                return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self._error(key, from_env, f"must be a number, not {_type_name(value)}")
            return None
        if not math.isfinite(value):
            self._error(key, from_env, "must be a finite number")
            return None
        return float(value)

    def _check_bounds(self, key: str, from_env: bool, value: float, lo: float | None, gt: float | None) -> bool:
        if lo is not None and value < lo:
            self._error(key, from_env, f"must be >= {lo:g}, got {value:g}")
            return False
        if gt is not None and value <= gt:
            self._error(key, from_env, f"must be > {gt:g}, got {value:g}")
            return False
        return True

    def optional_int(self, key: str, lo: int | None = None) -> int | None:
        """An integer, or None when the key is not given (no limit)."""
        if self._raw(key)[0] is _MISSING:
            return None
        return self.integer(key, 0, lo=lo)

    def number(self, key: str, default: float, lo: float | None = None, gt: float | None = None) -> float:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        number = self._to_number(key, value, from_env)
        if number is None or not self._check_bounds(key, from_env, number, lo, gt):
            return default
        return number

    def optional_number(self, key: str, gt: float | None = None) -> float | None:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return None
        number = self._to_number(key, value, from_env)
        if number is None or not self._check_bounds(key, from_env, number, None, gt):
            return None
        return number

    def number_list(self, key: str, default: tuple[float, ...], lo: float | None = None) -> tuple[float, ...]:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        if not isinstance(value, list):
            self._error(key, from_env, f"must be an array of numbers, not {_type_name(value)}")
            return default
        out: list[float] = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
                self._error(key, from_env, f"item {i} must be a finite number, not {_type_name(item)}")
                return default
            if lo is not None and item < lo:
                self._error(key, from_env, f"item {i} must be >= {lo:g}, got {item:g}")
                return default
            out.append(float(item))
        return tuple(out)

    def boolean(self, key: str, default: bool) -> bool:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        if from_env:
            text = value.strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            self._error(key, True, f"must be true or false, got{self._show(key, value)}")
            return default
        if not isinstance(value, bool):
            self._error(key, from_env, f"must be true or false, not {_type_name(value)}")
            return default
        return value

    def optional_string(self, key: str) -> str | None:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return None
        if not isinstance(value, str):
            self._error(key, from_env, f"must be a string, not {_type_name(value)}")
            return None
        return value

    def string(self, key: str, default: str, nonempty: bool = False) -> str:
        value = self.optional_string(key)
        if value is None:
            return default
        if nonempty and value.strip() == "":
            self._error(key, self._from_env(key), "must not be empty")
            return default
        return value

    def _from_env(self, key: str) -> bool:
        var = _ENV_OF.get(self._key(key))
        return var is not None and self.reader.env.get(var, "") != ""

    def choice(self, key: str, default: str, allowed: tuple[str, ...], upper: bool = False) -> str:
        """One of ``allowed``, compared without regard to case (stored as in ``allowed``)."""
        value = self.optional_string(key)
        if value is None:
            return default
        normalized = value.strip().upper() if upper else value.strip().lower()
        if normalized not in allowed:
            self._error(key, self._from_env(key), f"must be one of {', '.join(allowed)}, got {value!r}")
            return default
        return normalized

    def pattern(self, key: str, default: str, regex: re.Pattern[str], what: str) -> str:
        value = self.optional_string(key)
        if value is None:
            return default
        if not regex.fullmatch(value):
            self._error(key, self._from_env(key), f"must be {what}, got {value!r}")
            return default
        return value

    def path(self, key: str, default: Path) -> Path:
        value = self.optional_string(key)
        if value is None:
            return default.absolute()
        if value.strip() == "":
            self._error(key, self._from_env(key), "must not be empty")
            return default.absolute()
        if "\x00" in value:
            self._error(key, self._from_env(key), "must not contain a NUL character")
            return default.absolute()
        return Path(value).expanduser().absolute()

    def optional_path(self, key: str) -> Path | None:
        """A file path, or None when unset or set empty (an empty ``GW_*`` variable turns a file's key off)."""
        value = self.optional_string(key)
        if value is None or value.strip() == "":
            return None
        if "\x00" in value:
            self._error(key, self._from_env(key), "must not contain a NUL character")
            return None
        return Path(value).expanduser().absolute()

    def nats_url(self, key: str) -> str | None:
        value = self.optional_string(key)
        if value is None:
            return None
        from_env = self._from_env(key)
        servers = [u.strip() for u in value.split(",")]
        if not any(servers):
            self._error(key, from_env, "must not be empty (leave it unset for the embedded server)")
            return None
        ok = True
        for one in servers:
            problem = _nats_url_problem(one)
            if problem is not None:
                # the URL may carry a password: show it redacted
                self._error(key, from_env, f"{problem}: {redact_url(one)!r}")
                ok = False
        return value.strip() if ok else None


def _nats_url_problem(url: str) -> str | None:
    if url == "":
        return "has an empty entry in its comma-separated list"
    parts, _ = _split_url_password(url)
    if parts.scheme not in NATS_URL_SCHEMES:
        return "must be a nats:// or tls:// URL"
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return "has an invalid port"
    if not host:
        return "must name a host"
    if port is not None and not 1 <= port <= 65535:
        return "has an invalid port"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must not have a path, query or fragment"
    return None
