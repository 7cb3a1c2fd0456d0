"""Issue 24, Speed: the live task list stays responsive at 1,000 events/s. An admin's /ui/tasks page is open and
live while ``POST /api/tasks/batch`` creates about 1,000 tasks a second for 5 s (each create is one
``task.created`` event on the page's stream). Measured in the page itself (an init script, since the CSP forbids
inline script): the events the page received, the list's reloads (htmx requests of /ui/tasks/rows, cross-checked
with Playwright's request events), the main thread's stalls (the Long Tasks API, the longest gap between
requestAnimationFrame callbacks and the longest late tick of a 50 ms interval) and the time from a click on a row
checkbox to the next frame that shows it. Without the coalescing in console.js (one reload per event) the reload
count and spacing fail the test (measured: ~100 reloads in 5 s, one every ~50 ms).

Two faults the flood showed have their own tests: a reload already sent when a row is ticked must not swap the
selection away, and a page whose stream falls behind (SLOW_CONSUMER) must reconnect instead of stopping for good.

The figures are printed (``-s``) and quoted in docs/CONSOLE.md ("Live list under load")."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import msgspec
import pytest
from playwright.async_api import Browser, Request, Route, expect
from playwright.async_api import TimeoutError as PlaywrightTimeout

from scheduler_gateway.daemon.gateway import Gateway

from ..integration.harness import Api
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in

pytestmark = [pytest.mark.timeout(90), SESSION_LOOP]

RATE = 1000  # tasks (so task.created events) a second
BATCH = 20  # tasks per POST /api/tasks/batch: fifty requests a second, so the events come in small bursts
FLOOD_S = 5.0
PAGE_SIZE = 50  # the default page; 200 (the largest) costs ~60-80 ms of layout per reload, measured by hand

# Bounds, with margin for a loaded 2-core machine (the test's gateway, nats-server and Chromium share it):
# - reloads: console.js allows one a second, so a 5 s flood gives about 5; more than the window's seconds + 2 means
#   updates are not coalesced (one reload per event gives dozens), and consecutive reloads are at least MIN_GAP_MS apart
#   (a timer never fires early; 950 leaves room for clock rounding).
# - a main-thread task over 300 ms is what a person notices as a frozen page (RAIL's 100 ms response budget,
#   tripled for the shared machine): the Long Tasks API times the page's own work, which is what a reload per event
#   would pile up, but by the wall clock, so a task the renderer was descheduled in is longer (one of 206 ms, with
#   5 reloads, a 200 ms worst frame gap and clicks answered in 10-19 ms, was seen in a full-suite run on 2 cores).
#   The gaps between frames and the lateness of a 50 ms interval count the machine's scheduling even more (a 183 ms
#   frame gap with no long task at all was seen on the loaded machine), so they are held to 500 ms: still a page
#   that froze, not one that hiccupped.
# - a click shows its effect within 300 ms (the same budget plus a frame or two).
MIN_GAP_MS = 950
MAX_TASK_MS = 300
MAX_FRAME_GAP_MS = 500
MAX_CLICK_MS = 300

# Runs before the page's scripts: counts the stream's task events as the page receives them, records each list
# reload (htmx's request of /ui/tasks/rows and its swap), the frame gaps and interval lateness while ``on``,
# and each row checkbox click's latency (the input event's timestamp to the frame after its handler ran).
PROBE = r"""
(() => {
  const m = window.__gw = {on: false, t0: 0, events: 0, eventsOn: 0, lastEventAt: 0, perSecond: [], reloads: [],
                           swaps: 0, maxFrameGap: 0, frames: 0, maxLate: 0, clicks: [], longTasks: 0, longestTask: 0};
  m.disconnects = []; m.errors = 0; m.opens = 0;
  const add = EventTarget.prototype.addEventListener;
  EventSource.prototype.addEventListener = function (type, fn, opts) {
    if (typeof type === "string" && type.startsWith("task.")) {
      const inner = fn;
      fn = function (e) {
        m.events++;
        if (m.on) {
          const now = performance.now(), s = Math.floor((now - m.t0) / 1000);
          m.eventsOn++; m.lastEventAt = now; m.perSecond[s] = (m.perSecond[s] || 0) + 1;
        }
        return inner.call(this, e);
      };
    }
    if (type === "disconnect" && !this.__probed) {
      this.__probed = true;
      add.call(this, "disconnect", (e) => m.disconnects.push([performance.now() - m.t0, e.data]));
      add.call(this, "error", () => m.errors++);
      add.call(this, "open", () => m.opens++);
    }
    return add.call(this, type, fn, opts);
  };
  const isRows = (e) => String((e.detail && e.detail.pathInfo && e.detail.pathInfo.requestPath) || "")
    .indexOf("/ui/tasks/rows") === 0;
  document.addEventListener("htmx:beforeRequest", (e) => { if (isRows(e)) { m.reloads.push(performance.now()); } });
  document.addEventListener("htmx:afterSwap", (e) => { if (isRows(e) && m.on) { m.swaps++; } });
  let lastFrame = 0;
  const frame = (t) => {
    if (m.on) { if (lastFrame) { m.maxFrameGap = Math.max(m.maxFrameGap, t - lastFrame); } m.frames++; lastFrame = t; }
    else { lastFrame = 0; }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
  let lastTick = performance.now();
  setInterval(() => {
    const now = performance.now();
    if (m.on) { m.maxLate = Math.max(m.maxLate, now - lastTick - 50); }
    lastTick = now;
  }, 50);
  try {
    new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) {
        if (m.on) { m.longTasks++; m.longestTask = Math.max(m.longestTask, entry.duration); }
      }
    }).observe({type: "longtask"});
  } catch (err) { /* no Long Tasks API: the frame gaps still tell */ }
  document.addEventListener("click", (e) => {
    const box = e.target;
    if (!(box && box.classList && box.classList.contains("row-select"))) { return; }
    const start = e.timeStamp;  // when the input reached the page, queueing behind a busy main thread included
    requestAnimationFrame(() => setTimeout(() => {
      m.clicks.push({at: start, ms: performance.now() - start, checked: box.checked});
    }, 0));
  }, true);
})();
"""


async def flood(api: Api, kind: str) -> tuple[int, float]:
    """Creates of ``kind`` at RATE a second for FLOOD_S, in batches on a fixed schedule (a late batch is sent at
    once, not skipped): the tasks created and the seconds it took."""
    created = 0
    start = time.monotonic()
    for n in range(int(FLOOD_S * RATE / BATCH)):
        delay = start + n * BATCH / RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        body = {"tasks": [{"kind": kind, "payload": {"n": n * BATCH + i}} for i in range(BATCH)]}
        status, answer, _ = await api.call("POST", "/api/tasks/batch", body)
        assert status == 200, (status, answer)
        created += sum(1 for item in answer["items"] if item["status"] == 201)
    return created, time.monotonic() - start


async def test_the_live_list_coalesces_a_flood_of_1000_events_a_second(
    gateway: Gateway, api: Api, browser: Browser
) -> None:
    page = await signed_in(browser, gateway)
    await page.add_init_script(PROBE)
    list_requests: list[float] = []

    def on_request(request: Request) -> None:
        if "/ui/tasks/rows" in request.url:
            list_requests.append(time.monotonic())

    page.on("request", on_request)
    await page.goto(base(gateway) + f"/ui/tasks?size={PAGE_SIZE}")
    await expect(page.locator("#live-on")).to_be_visible()
    # the stream is connected once an event reaches the page (and the list reloads for it)
    await api.create({"kind": "warm"})
    await page.wait_for_function("() => window.__gw.events >= 1 && window.__gw.reloads.length >= 1", timeout=5000)
    await page.wait_for_timeout(1100)  # past the reload gap: the flood starts from a quiet list
    list_requests.clear()
    t0 = await page.evaluate(
        "() => { const m = window.__gw; m.reloads = []; m.t0 = performance.now(); m.on = true; return m.t0; }"
    )

    flooding = asyncio.create_task(flood(api, "flood"))
    box = page.locator("#task-rows input.row-select").nth(3)
    for at in (1.5, 3.5):  # two clicks into the flood: tick a row, untick it 0.6 s later
        await asyncio.sleep(max(0.0, at - (await page.evaluate("() => performance.now()") - t0) / 1000))
        await box.click()
        await expect(box).to_be_checked(timeout=2000)
        await asyncio.sleep(0.6)  # held: a selected row is never reloaded away
        await expect(box).to_be_checked()
        await box.click()
        await expect(box).not_to_be_checked(timeout=2000)
    created, took = await flooding
    # every event reaches the page (on a starved machine the stream can trail the creates by a few seconds)
    try:
        await page.wait_for_function(f"() => window.__gw.eventsOn >= {created}", timeout=20_000)
    except PlaywrightTimeout:
        got = await page.evaluate("() => { const m = window.__gw; return [m.eventsOn, m.perSecond, m.disconnects]; }")
        raise AssertionError(
            f"the page got {got[0]} of {created} events, per second {got[1]}, closed {got[2]}"
        ) from None
    await page.wait_for_timeout(300)
    m: dict[str, Any] = await page.evaluate("() => { window.__gw.on = false; return window.__gw; }")
    t1 = await page.evaluate("() => performance.now()")

    span_s = (t1 - t0) / 1000
    delivered_s = (m["lastEventAt"] - t0) / 1000
    reloads = [(t - t0) / 1000 for t in m["reloads"]]
    gaps_ms = [round((b - a) * 1000) for a, b in itertools.pairwise(reloads)]
    clicks = [round(c["ms"]) for c in m["clicks"]]
    clicked_at = [round((c["at"] - t0) / 1000, 2) for c in m["clicks"]]
    print(
        f"\ncreated {created} in {took:.2f} s ({created / took:.0f}/s); page got {m['eventsOn']} task events in "
        f"{delivered_s:.2f} s ({m['eventsOn'] / delivered_s:.0f}/s; per second {m['perSecond']}); list reloads "
        f"{len(reloads)} ({len(reloads) / span_s:.2f}/s, Playwright saw {len(list_requests)}, swaps {m['swaps']}) at "
        f"{[round(r, 2) for r in reloads]} s, gaps {gaps_ms} ms; worst frame gap {m['maxFrameGap']:.0f} ms over "
        f"{m['frames']} frames; worst 50 ms tick late by {m['maxLate']:.0f} ms; long tasks {m['longTasks']} "
        f"(longest {m['longestTask']:.0f} ms); click to frame {clicks} ms at {clicked_at} s"
    )
    assert created == RATE * FLOOD_S
    assert created / took >= 0.7 * RATE, f"the flood ran at {created / took:.0f}/s"
    # the page did receive a flood (about 1,000 events a second here; a starved stream trails, bounded loosely)
    assert m["eventsOn"] / delivered_s >= 0.4 * RATE, m["perSecond"]
    # coalesced: about one reload a second, never two within MIN_GAP_MS, not one per event
    assert 2 <= len(reloads) <= span_s + 2, reloads
    assert abs(len(list_requests) - len(reloads)) <= 1  # Playwright may see a reload sent after the snapshot
    assert all(g >= MIN_GAP_MS for g in gaps_ms), gaps_ms
    # responsive: no stall a person would see as a frozen page, and a click shows within MAX_CLICK_MS
    assert m["longestTask"] <= MAX_TASK_MS, m["longestTask"]
    assert m["maxFrameGap"] <= MAX_FRAME_GAP_MS, m["maxFrameGap"]
    assert m["maxLate"] <= MAX_FRAME_GAP_MS, m["maxLate"]
    assert len(clicks) == 4 and all(c["checked"] == (i % 2 == 0) for i, c in enumerate(m["clicks"])), m["clicks"]
    assert max(clicks) <= MAX_CLICK_MS, clicks
    assert clicked_at[0] < took, clicked_at  # the first tick's figure is taken under the flood
    await page.context.close()


async def test_a_reload_in_flight_when_a_row_is_ticked_keeps_the_selection(
    gateway: Gateway, api: Api, browser: Browser
) -> None:
    """The hold is checked when a reload is sent; a reload already on its way when a row is ticked (a window of
    tens of milliseconds each second under a flood) must not swap the selection away when it answers."""
    for n in range(3):
        await api.create({"kind": "sel", "payload": {"n": n}})
    page = await signed_in(browser, gateway)
    sent = asyncio.Event()
    release = asyncio.Event()

    async def hold_first(route: Route) -> None:
        if not sent.is_set():
            sent.set()
            await release.wait()
        await route.continue_()

    await page.goto(base(gateway) + "/ui/tasks")
    await expect(page.locator("#live-on")).to_be_visible()
    await page.wait_for_timeout(300)  # the EventSource connects
    await page.route("**/ui/tasks/rows*", hold_first)
    newer = await api.create({"kind": "sel", "payload": {"n": 3}})
    await asyncio.wait_for(sent.wait(), 5)  # the live reload is on its way
    box = page.locator("#task-rows input.row-select").first
    await box.click()
    await expect(box).to_be_checked()
    async with page.expect_response("**/ui/tasks/rows*"):
        release.set()
    await page.wait_for_timeout(200)  # htmx has the answer
    await expect(box).to_be_checked()  # the ticked row is still there, ticked
    await expect(page.locator("#live-held")).to_be_visible()
    await expect(page.locator(f"#row-{newer['id']}")).to_have_count(0)
    await box.click()  # cleared: the list catches up
    await expect(page.locator(f"#row-{newer['id']}")).to_be_visible(timeout=3000)
    await expect(page.locator("#live-held")).to_be_hidden()
    await page.context.close()


async def test_the_live_list_reconnects_when_its_stream_falls_behind(
    gateway: Gateway, api: Api, browser: Browser
) -> None:
    """A page whose stream falls behind is disconnected with SLOW_CONSUMER (docs/API.md: reconnect with
    Last-Event-ID); the list goes on updating live instead of stopping for good. Here a buffer of 8 events and a
    batch of 200 creates stand for a page 4,096 events behind a flood."""
    gateway.events_api.settings = msgspec.structs.replace(gateway.events_api.settings, buffer_events=8)
    page = await signed_in(browser, gateway)
    await page.add_init_script(PROBE)
    await page.goto(base(gateway) + "/ui/tasks")
    await expect(page.locator("#live-on")).to_be_visible()
    await api.create({"kind": "warm"})
    await page.wait_for_function("() => window.__gw.reloads.length >= 1", timeout=5000)
    status, _, _ = await api.call("POST", "/api/tasks/batch", {"tasks": [{"kind": "burst"} for _ in range(200)]})
    assert status == 200
    await page.wait_for_function("() => window.__gw.disconnects.length >= 1", timeout=5000)
    reasons = await page.evaluate("() => window.__gw.disconnects.map((d) => JSON.parse(d[1]).reason)")
    assert reasons == ["SLOW_CONSUMER"], reasons
    later = await api.create({"kind": "after"})
    await expect(page.locator(f"#row-{later['id']}")).to_be_visible(timeout=10_000)  # reconnected (~3 s retry)
    await page.context.close()
