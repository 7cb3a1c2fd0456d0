// scheduler-gateway console: the task list's row selection and its live refresh (served from /ui/static/;
// the CSP allows no inline script). Without it the list still works: filters, paging and bulk actions are forms.
(function () {
  "use strict";
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
    es.addEventListener("disconnect", function () { es.close(); });
  }
})();
