// bigfleet-inspect dashboard: refreshes a page's live section in place (ADR-0136).
//
// Served by inspect itself as /static/live.js (the Content-Security-Policy allows scripts
// from 'self' only). Every `data-refresh` seconds it fetches the current URL, takes the
// element with id "live" from the answer and swaps it into this page: no full reload, so
// scroll position, the header form and anything a reader typed stay as they are. Without
// JavaScript the pages are complete, they just do not update.
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh")) || 0;
  var live = document.getElementById("live");
  if (!live || seconds <= 0) {
    return;
  }
  var status = document.getElementById("live-status");
  var state = { swaps: 0, failures: 0, lastError: "" };
  // Read by the headless-browser test; also handy from a console.
  window.bigfleetLive = state;
  var busy = false;

  function show(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function swap(text) {
    var fresh = new DOMParser()
      .parseFromString(text, "text/html")
      .getElementById("live");
    if (!fresh) {
      throw new Error("the answer has no live section");
    }
    var nodes = Array.prototype.slice.call(fresh.childNodes).map(function (n) {
      return document.adoptNode(n);
    });
    live.replaceChildren.apply(live, nodes);
  }

  function tick() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.href, {
      cache: "no-store",
      credentials: "same-origin",
      headers: { Accept: "text/html" },
    })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (text) {
        swap(text);
        state.swaps += 1;
        show(
          "Updated in place at " + new Date().toLocaleTimeString() +
            " (every " + seconds + " s)."
        );
      })
      .catch(function (e) {
        state.failures += 1;
        state.lastError = String(e && e.message ? e.message : e);
        show("Refresh failed (" + state.lastError + "); retrying.");
      })
      .then(function () {
        busy = false;
      });
  }

  window.setInterval(tick, seconds * 1000);
})();
