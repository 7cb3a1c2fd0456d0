"""The bounds of a kind's flow settings (docs/FLOW.md, "The settings of a kind"): one check for every way a
setting comes in. ``KindService.update`` runs it on every change (the HTTP API, the console's form, and so
``gatewayctl kinds set``), the console's form runs it to show the error on the form, and the config loader runs
it on ``[kinds.<kind>]``.

Why bounds at all: a period of ``inf`` or ``nan`` is stored by the JSON encoder as ``null`` and the document no
longer decodes; an int past 64 bits cannot be bound by a database driver. The bounds are the API's
(``wire/kind_api.py``): counts and rate limits 0 or 1 to 1 000 000, a rate's period finite, > 0, at most 366 days.
"""

from __future__ import annotations

import math
from typing import Any

from scheduler_gateway.wire.errors import InvalidArgument
from scheduler_gateway.wire.kind_api import MAX_LIMIT, MAX_PERIOD_S

from .flow import KindSettings, Rate

#: a setting's name in the API (``details.field``) -> (its name in KindSettings, the least count it takes)
_COUNTS = {"concurrency": ("concurrency", 0), "keyConcurrency": ("key_concurrency", 1)}
_RATES = {"rate": "rate", "keyRate": "key_rate"}
API_NAMES = {"paused": "paused", **{v[0]: k for k, v in _COUNTS.items()}, **{v: k for k, v in _RATES.items()}}


def check_count(field: str, value: object, least: int) -> int:
    """A whole number from ``least`` to ``MAX_LIMIT`` (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{field} must be a whole number", details={"field": field})
    if not least <= value <= MAX_LIMIT:
        raise InvalidArgument(f"{field} must be from {least} to {MAX_LIMIT}", details={"field": field})
    return value


def check_period(field: str, value: object) -> float:
    """A finite number of seconds above 0, at most ``MAX_PERIOD_S`` (366 days)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{field} must be a number of seconds", details={"field": field})
    if not (math.isfinite(value) and 0 < value <= MAX_PERIOD_S):
        raise InvalidArgument(
            f"{field} must be a finite number of seconds above 0, at most {MAX_PERIOD_S:.0f} (366 days)",
            details={"field": field},
        )
    return float(value)


def check_rate(field: str, rate: Rate) -> Rate:
    check_count(f"{field}.limit", rate.limit, 1)
    check_period(f"{field}.periodSeconds", rate.period_s)
    return rate


def check_changes(changes: dict[str, Any]) -> None:
    """Each field of a change (KindSettings names; None removes a limit) within its bounds, else 400
    INVALID_ARGUMENT naming the field as the API does."""
    for name, value in changes.items():
        field = API_NAMES.get(name, name)
        if value is None and name != "paused":
            continue
        if name == "paused":
            if not isinstance(value, bool):
                raise InvalidArgument("paused must be true or false", details={"field": field})
        elif field in _COUNTS:
            check_count(field, value, _COUNTS[field][1])
        elif field in _RATES:
            if not isinstance(value, Rate):
                raise InvalidArgument(f"{field} must be {{limit, periodSeconds}} or null", details={"field": field})
            check_rate(field, value)
        else:
            raise InvalidArgument(f"not a kind setting: {name}", details={"field": name})


def check_settings(s: KindSettings) -> None:
    """Every field of whole settings (the config's starting values)."""
    check_changes({name: getattr(s, name) for name in API_NAMES})
