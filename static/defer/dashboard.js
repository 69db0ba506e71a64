/* flask_defer: the operator dashboard's small script.
 *
 * htmx does the work (refreshing the list, submitting filters and actions); this
 * only makes refused requests visible. htmx does not swap 4xx answers by default, so
 * a 400 whose body is an outcome fragment (a bad reschedule time, a bulk cancel
 * without a filter) is put in the outcome region, and any other error (403 after a
 * logout, 404, a lost connection) is said there in words: the page's own, in the
 * reader's language (data-defer-text-* on the outcome region), English without them.
 * No inline script is needed, so it works under a strict CSP.
 */
(function () {
  "use strict";
  if (window.flaskDeferDashboard) { return; }

  function region() { return document.getElementById("defer-outcome"); }

  // "refreshes every 5 s" is only true when this script (and htmx) runs.
  function showRefreshNote() {
    document.querySelectorAll("[data-defer-refresh-note]").forEach(function (note) {
      note.hidden = false;
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", showRefreshNote);
  } else {
    showRefreshNote();
  }

  function inDashboard(elt) {
    return !!(elt && elt.closest && elt.closest("[data-defer-dashboard]"));
  }

  function say(text) {
    var out = region();
    if (!out) { return; }
    var box = document.createElement("div");
    box.className = "defer-outcome defer-outcome--refused";
    box.setAttribute("data-defer-result", "error");
    var span = document.createElement("span");
    span.textContent = text;
    box.appendChild(span);
    out.replaceChildren(box);
  }

  // The server renders each text translated onto the region; these are the fallbacks.
  function text(name, fallback) {
    var out = region();
    return (out && out.getAttribute("data-defer-text-" + name)) || fallback;
  }

  function describe(status) {
    if (status === 403) {
      return text("forbidden", "Not authorised any more: sign in again and reload the page.");
    }
    if (status === 404) { return text("missing", "That job no longer exists (it may have been pruned)."); }
    if (status === 400) { return text("refused", "The request was refused: reload the page and try again."); }
    return text("error", "The server answered with an error (HTTP {status}). Try again.")
      .replace("{status}", String(status));
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var detail = event.detail;
    if (!inDashboard(detail.elt) || !detail.xhr || detail.xhr.status < 400) { return; }
    var status = detail.xhr.status;
    if (status === 400 && /data-defer-result=/.test(detail.xhr.responseText || "")) {
      detail.shouldSwap = true;
      detail.isError = false;
      detail.target = region();
      detail.swapOverride = "innerHTML";
      return;
    }
    detail.shouldSwap = false;
    say(describe(status));
  });

  document.addEventListener("htmx:sendError", function (event) {
    if (inDashboard(event.detail && event.detail.elt)) {
      say(text("offline", "Could not reach the server; the figures may be out of date."));
    }
  });

  window.flaskDeferDashboard = { say: say };
})();
