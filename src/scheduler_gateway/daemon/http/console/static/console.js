// scheduler-gateway console: the task list's row selection and its live refresh (served from /ui/static/;
// the CSP allows no inline script). Without it the list still works: filters, paging and bulk actions are forms.
(function () {
  "use strict";
  // a phone shows the tasks first: the filters fold behind their "Filters" toggle (open when a filter is set)
  var toggle = document.getElementById("filters-toggle");
  if (toggle && window.matchMedia && window.matchMedia("(max-width: 720px)").matches &&
      toggle.getAttribute("data-active") !== "1") { toggle.open = false; }
  var rows = function () { return document.getElementById("task-rows"); };
  var boxes = function () { return document.querySelectorAll("input.row-select"); };
  var anySelected = function () {
    var all = boxes();
    for (var i = 0; i < all.length; i++) { if (all[i].checked) { return true; } }
    return false;
  };
  var held = document.getElementById("live-held");
  var pending = false;
  var timer = null;
  var last = 0;
  var MIN_GAP_MS = 1000; // at most one reload a second, however many events arrive: they are coalesced
  var refresh = function () {
    timer = null;
    if (anySelected()) { pending = true; if (held) { held.hidden = false; } return; } // keep the selection
    pending = false;
    last = Date.now();
    var el = rows();
    if (el && window.htmx) { window.htmx.trigger(el, "gw:refresh"); }
  };
  var onEvent = function () {
    if (timer !== null) { return; }
    timer = setTimeout(refresh, Math.max(250, MIN_GAP_MS - (Date.now() - last)));
  };
  // the hold is checked when a reload is sent: one already on its way when a row is ticked is not swapped in
  // (it would drop the selection); the list reloads once the selection is cleared
  document.addEventListener("htmx:beforeSwap", function (e) {
    var el = rows();
    if (el && e.detail.target === el && anySelected()) {
      e.detail.shouldSwap = false; pending = true; if (held) { held.hidden = false; }
    }
  });
  var selectPage = document.getElementById("select-page");
  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t === selectPage) {
      var all = boxes();
      for (var i = 0; i < all.length; i++) { all[i].checked = selectPage.checked; }
    }
    if (t === selectPage || (t.classList && t.classList.contains("row-select"))) {
      if (!anySelected()) { if (held) { held.hidden = true; } if (pending) { onEvent(); } }
      else if (selectPage && t !== selectPage) {
        var every = true, list = boxes();
        for (var j = 0; j < list.length; j++) { if (!list[j].checked) { every = false; } }
        selectPage.checked = every;
      }
    }
  });
  var live = document.getElementById("live-events");
  if (live && window.EventSource) {
    var es = new EventSource("/ui/stream");
    var types = (live.getAttribute("data-events") || "").split(" ");
    for (var k = 0; k < types.length; k++) { if (types[k]) { es.addEventListener(types[k], onEvent); } }
    // only a session that ended stops the list; any other reason (SLOW_CONSUMER when the page fell 4,096 events
    // behind a flood, SHUTTING_DOWN, STREAM_RESET, UNAVAILABLE) is left to the EventSource, which reconnects with
    // Last-Event-ID and resumes (docs/API.md)
    es.addEventListener("disconnect", function (e) {
      var reason = "";
      try { reason = JSON.parse(e.data).reason; } catch (err) { reason = ""; }
      if (reason === "SESSION_ENDED") { es.close(); } else { onEvent(); }
    });
  }
})();
