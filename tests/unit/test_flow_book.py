"""The dispatcher's start log (actors/dispatch_flow.py ``FlowBook``): rate windows counted by binary search over
starts kept in time order, per key for a key rate, a start learnt late put in its place, and the moment the
oldest start leaves a window."""

from __future__ import annotations

from scheduler_gateway.actors.dispatch_flow import FlowBook
from scheduler_gateway.actors.model.flow import KindSettings, Rate


def book(**settings: object) -> FlowBook:
    fb = FlowBook()
    fb.set(KindSettings(kind="k", **settings))  # type: ignore[arg-type]
    return fb


def start(fb: FlowBook, n: int, at: float, key: str | None = None) -> None:
    fb.running(f"t{n}", "k", key, at)
    fb.stopped(f"t{n}")


def test_a_rate_counts_the_starts_inside_its_window_only() -> None:
    fb = book(rate=Rate(limit=3, period_s=1.0))
    for n, at in enumerate((10.0, 10.5, 10.9)):
        start(fb, n, at)
    assert fb.rule("k", None, 10.95, 0, 0) == "kind_rate"  # three in (9.95, 10.95]
    assert fb.next_free_at("k", 10.95) == 11.0  # when 10.0 leaves it
    assert fb.rule("k", None, 11.0, 0, 0) is None  # 10.0 left the window: two in it
    assert fb.rule("k", None, 11.0, 1, 0) == "kind_rate"  # an offer out counts as a start to come


def test_a_start_learnt_late_goes_in_its_place() -> None:
    fb = book(rate=Rate(limit=2, period_s=1.0))
    start(fb, 1, 10.8)
    start(fb, 2, 10.1)  # another instance's start, absorbed after a later one
    assert fb.next_free_at("k", 10.9) == 11.1  # the oldest start in the window is 10.1, not 10.8
    assert fb.rule("k", None, 10.9, 0, 0) == "kind_rate"
    assert fb.rule("k", None, 11.15, 0, 0) is None


def test_a_key_rate_counts_the_keys_own_starts_and_forgets_old_keys() -> None:
    fb = book(key_rate=Rate(limit=1, period_s=2.0))
    start(fb, 1, 10.0, "a")
    start(fb, 2, 10.5, "b")
    assert fb.rule("k", "a", 11.0, 0, 0) == "key_rate"
    assert fb.rule("k", "c", 11.0, 0, 0) is None  # another key is not held by a's start
    assert fb.rule("k", "a", 12.0, 0, 0) is None  # a's start left its window
    assert ("k", "a") not in fb._key_starts  # an emptied log is dropped
    fb._sweep_keys(20.0)
    assert not fb._key_starts
