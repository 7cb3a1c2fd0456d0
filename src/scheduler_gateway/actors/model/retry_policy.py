"""Retry backoff: the first delay doubles each attempt, capped, with +-20% jitter drawn by the caller."""

from __future__ import annotations

MAX_BACKOFF_S = 300.0
JITTER = 0.2


def backoff_s(base_s: float, failed_attempts: int, jitter_unit: float) -> float:
    """Delay before the next attempt after ``failed_attempts`` failures in the current budget.

    ``jitter_unit`` is a number in [-1, 1] (the caller's random draw), so the function stays pure.
    """
    raw = base_s * float(2 ** max(0, failed_attempts - 1))
    capped = min(raw, MAX_BACKOFF_S)
    return max(0.0, capped * (1.0 + JITTER * max(-1.0, min(1.0, jitter_unit))))
