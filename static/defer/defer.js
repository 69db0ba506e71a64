/* flask_defer: the Undo toasts' behaviour in the browser.
 *
 * The server renders each toast with the seconds left in its Undo window (computed
 * from the job's row), so this script never decides *whether* Undo is possible: it
 * only counts the server's number down, hides the button at zero, and settles the
 * toast. Undo itself is an htmx POST (or a plain form POST without JavaScript).
 *
 * Also here: the `z` shortcut (undo the newest toast, as in Gmail), an aria-live
 * announcer, dismiss buttons, and refreshing the toasts when an htmx response says
 * `HX-Trigger: defer-toasts`, when the tab becomes visible again, or when the page
 * comes back from the back/forward cache.
 *
 * No inline script or style is needed, so it works under a strict CSP.
 */
(function () {
  "use strict";
  if (window.flaskDefer) { return; }

  var SETTLED_LINGER_MS = 4000;
  var OUTCOME_LINGER_MS = 8000;
  var TICK_MS = 200;
  var DISMISSED_KEY = "flask_defer.dismissed";
  var ANNOUNCED_KEY = "flask_defer.announced";

  var ticker = null;

  function now() { return performance.now(); }

  /* When the page's HTML arrived: the moment the server's remaining seconds refer to. */
  function navigationAnchor() {
    var entries = performance.getEntriesByType ? performance.getEntriesByType("navigation") : [];
    var nav = entries && entries[0];
    if (nav && nav.responseStart > 0 && nav.responseStart <= now()) { return nav.responseStart; }
    return now();
  }

  function region() { return document.querySelector("[data-defer-toasts]"); }
  function list() { var r = region(); return r && r.querySelector("[data-defer-list]"); }

  /* ---- session memory (announced and dismissed toasts survive navigation) ---- */

  function remembered(key) {
    try { return JSON.parse(sessionStorage.getItem(key) || "[]"); } catch (e) { return []; }
  }
  function remember(key, id) {
    try {
      var ids = remembered(key);
      if (ids.indexOf(id) === -1) { ids.push(id); }
      sessionStorage.setItem(key, JSON.stringify(ids.slice(-50)));
    } catch (e) { /* storage disabled: nothing to remember */ }
  }

  /* ---- announcements for screen readers ---- */

  function announce(text) {
    var r = region();
    var live = r && r.querySelector("[data-defer-announcer]");
    if (!live || !text) { return; }
    live.textContent = "";
    // A changed text node is what screen readers announce; clear, then set.
    setTimeout(function () { live.textContent = text; }, 50);
  }

  function labelOf(toast) {
    var text = toast.querySelector(".defer-toast__text");
    return text ? text.textContent.trim() : "";
  }

  /* ---- toasts ---- */

  function showClose(toast) {
    var close = toast.querySelector("[data-defer-dismiss]");
    if (close) { close.hidden = false; }
  }

  function dismiss(toast) {
    if (!toast || toast.__deferLeaving) { return; }
    toast.__deferLeaving = true;
    if (toast.__defer) { remember(DISMISSED_KEY, toast.getAttribute("data-defer-toast")); }
    toast.classList.add("defer-toast--leaving");
    setTimeout(function () { if (toast.parentNode) { toast.parentNode.removeChild(toast); } }, 250);
  }

  function initToast(toast, anchor) {
    if (toast.__defer) { return; }
    var id = toast.getAttribute("data-defer-toast");
    if (remembered(DISMISSED_KEY).indexOf(id) !== -1) {
      toast.parentNode.removeChild(toast);
      return;
    }
    var remaining = parseFloat(toast.getAttribute("data-defer-remaining")) || 0;
    var fraction = parseFloat(toast.getAttribute("data-defer-fraction")) || 0;
    toast.__defer = { deadline: anchor + remaining * 1000, remaining: remaining, fraction: fraction };
    showClose(toast);
    startBar(toast);
    update(toast);
    if (toast.classList.contains("defer-toast--live")) {
      if (fraction > 0.8 && remembered(ANNOUNCED_KEY).indexOf(id) === -1) {
        remember(ANNOUNCED_KEY, id);
        announce(labelOf(toast) + ". Undo is possible for " + Math.ceil(secondsLeft(toast)) +
          " seconds: press Z.");
      }
      startTicking();
    }
  }

  function secondsLeft(toast) {
    return Math.max((toast.__defer.deadline - now()) / 1000, 0);
  }

  function startBar(toast) {
    var bar = toast.querySelector(".defer-toast__bar");
    var state = toast.__defer;
    if (!bar || !state || state.remaining <= 0) { return; }
    var left = secondsLeft(toast);
    toast.classList.add("defer-toast--timed"); // shows the bar, so it can transition
    bar.style.transition = "none";
    bar.style.transform = "scaleX(" + (state.fraction * left / state.remaining) + ")";
    void bar.offsetWidth; // apply the starting width before transitioning from it
    bar.style.transition = "transform " + left + "s linear";
    bar.style.transform = "scaleX(0)";
  }

  function update(toast) {
    if (!toast.classList.contains("defer-toast--live") || !toast.__defer) { return; }
    // Once asked, the server's answer decides; reaching zero meanwhile must not
    // settle the toast as if nothing had been clicked.
    if (toast.getAttribute("data-defer-busy")) { return; }
    var left = secondsLeft(toast);
    if (left <= 0) { settle(toast); return; }
    var count = toast.querySelector("[data-defer-count]");
    var shown = String(Math.ceil(left));
    if (count && count.textContent !== shown) { count.textContent = shown; }
  }

  /* The window closed: the job will run. No button any more; say it is done. */
  function settle(toast) {
    toast.classList.remove("defer-toast--live");
    toast.classList.add("defer-toast--settled");
    var form = toast.querySelector(".defer-toast__form");
    if (form) { form.parentNode.removeChild(form); }
    var settled = toast.querySelector("[data-defer-settled]");
    if (settled) { settled.hidden = false; }
    announce(labelOf(toast) + (settled ? " — " + settled.textContent.trim() : ""));
    setTimeout(function () { dismiss(toast); }, SETTLED_LINGER_MS);
  }

  function liveToasts() {
    var l = list();
    return l ? Array.prototype.slice.call(l.querySelectorAll(".defer-toast--live")) : [];
  }

  function startTicking() {
    if (ticker !== null) { return; }
    ticker = setInterval(function () {
      var live = liveToasts();
      live.forEach(update);
      if (!live.length) { clearInterval(ticker); ticker = null; }
    }, TICK_MS);
  }

  function initOutcome(toast) {
    if (toast.__deferOutcome) { return; }
    toast.__deferOutcome = true;
    showClose(toast);
    announce(labelOf(toast));
    setTimeout(function () { dismiss(toast); }, OUTCOME_LINGER_MS);
  }

  function initAll(root, anchor) {
    var scope = root || document;
    Array.prototype.forEach.call(scope.querySelectorAll(".defer-toast--outcome"), initOutcome);
    Array.prototype.forEach.call(scope.querySelectorAll("[data-defer-toast]"), function (t) {
      initToast(t, anchor);
    });
  }

  /* ---- Undo ---- */

  function submitUndo(toast) {
    var form = toast.querySelector(".defer-toast__form");
    if (!form || toast.getAttribute("data-defer-busy")) { return; }
    var button = form.querySelector("button[type=submit]");
    if (form.requestSubmit) { form.requestSubmit(button); } else { form.submit(); }
  }

  function undoNewest() {
    var live = liveToasts().filter(function (t) { return !t.getAttribute("data-defer-busy"); });
    if (!live.length) { return false; }
    submitUndo(live[live.length - 1]);
    return true;
  }

  function isTyping(target) {
    if (!target || !target.closest) { return false; }
    if (target.isContentEditable) { return true; }
    return !!target.closest(
      "textarea, select, input:not([type=button]):not([type=submit]):not([type=reset])" +
      ":not([type=checkbox]):not([type=radio]):not([type=range]):not([type=color])"
    );
  }

  function onKey(event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey || event.repeat) {
      return;
    }
    if (event.key !== "z" && event.key !== "Z") { return; }
    if (isTyping(event.target)) { return; }
    if (undoNewest()) { event.preventDefault(); }
  }

  function toastOf(event) {
    var elt = event.detail && event.detail.elt;
    return elt && elt.closest ? elt.closest(".defer-toast") : null;
  }

  function onBeforeRequest(event) {
    var toast = toastOf(event);
    if (!toast) { return; }
    toast.setAttribute("data-defer-busy", "1");
    toast.classList.add("defer-toast--asking");
  }

  function onAfterRequest(event) {
    var toast = toastOf(event);
    if (toast) { toast.removeAttribute("data-defer-busy"); toast.classList.remove("defer-toast--asking"); }
  }

  function showError(toast, text) {
    var settled = toast.querySelector("[data-defer-settled]");
    if (settled) { settled.textContent = text; settled.hidden = false; }
    toast.classList.add("defer-toast--error");
    announce(text);
  }

  function onResponseError(event) {
    var toast = toastOf(event);
    if (!toast) { return; }
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    if (status === 404) {
      showError(toast, "This can no longer be undone here.");
    } else if (status === 400 || status === 403) {
      showError(toast, "Your session changed: reload the page and try again.");
    } else {
      showError(toast, "Could not undo (error " + status + "). Try again.");
    }
  }

  function onSendError(event) {
    var toast = toastOf(event);
    if (toast) { showError(toast, "Could not reach the server. Try again."); }
  }

  function onLoad(event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || !elt.classList) { return; }
    if (elt.classList.contains("defer-toast--outcome")) {
      initOutcome(elt);
      var close = elt.querySelector("[data-defer-dismiss]");
      if (close && (document.activeElement === document.body || !document.activeElement)) {
        close.focus({ preventScroll: true });
      }
    }
  }

  /* ---- refreshing from the server ---- */

  function merge(html, anchor) {
    var l = list();
    if (!l) { return; }
    var template = document.createElement("template");
    template.innerHTML = html;
    var fresh = {};
    Array.prototype.forEach.call(template.content.querySelectorAll("[data-defer-toast]"), function (t) {
      var id = t.getAttribute("data-defer-toast");
      fresh[id] = true;
      var existing = l.querySelector('[data-defer-toast="' + id + '"]');
      if (existing) {
        if (existing.__defer && existing.classList.contains("defer-toast--live")) {
          // Re-anchor on the server's clock (after a sleep, a bfcache restore ...).
          existing.__defer.deadline = anchor + (parseFloat(t.getAttribute("data-defer-remaining")) || 0) * 1000;
        }
        return;
      }
      l.appendChild(t);
      if (window.htmx) { window.htmx.process(t); }
      initToast(t, anchor);
    });
    liveToasts().forEach(function (t) {
      var id = t.getAttribute("data-defer-toast");
      if (fresh[id] || t.getAttribute("data-defer-busy")) { return; }
      // No longer undoable on the server: undone in another tab, or its window ended.
      if (secondsLeft(t) < 1) { settle(t); } else { dismiss(t); }
    });
  }

  function refresh() {
    var r = region();
    if (!r || !window.fetch) { return; }
    var sent = now();
    fetch(r.getAttribute("data-defer-refresh-url"), {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "HX-Request": "true", "HX-Current-URL": location.href }
    }).then(function (response) {
      if (!response.ok) { throw new Error("toasts: HTTP " + response.status); }
      return response.text();
    }).then(function (html) {
      // The server measured the time left somewhere between sending and receiving.
      merge(html, (sent + now()) / 2);
    }).catch(function () { /* keep what is shown; the next refresh corrects it */ });
  }

  /* ---- wiring ---- */

  function start() {
    var r = region();
    if (!r || r.__deferStarted) { return; }
    r.__deferStarted = true;
    r.addEventListener("click", function (event) {
      var close = event.target.closest && event.target.closest("[data-defer-dismiss]");
      if (close) { dismiss(close.closest(".defer-toast")); }
    });
    initAll(r, navigationAnchor());
    var entries = performance.getEntriesByType ? performance.getEntriesByType("navigation") : [];
    if (entries[0] && entries[0].type === "back_forward") { refresh(); }
  }

  document.addEventListener("keydown", onKey);
  document.addEventListener("defer-toasts", refresh);
  document.addEventListener("htmx:beforeRequest", onBeforeRequest);
  document.addEventListener("htmx:afterRequest", onAfterRequest);
  document.addEventListener("htmx:responseError", onResponseError);
  document.addEventListener("htmx:sendError", onSendError);
  document.addEventListener("htmx:load", onLoad);
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") { refresh(); }
  });
  window.addEventListener("pageshow", function (event) { if (event.persisted) { refresh(); } });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }

  window.flaskDefer = { refresh: refresh, undoNewest: undoNewest };
})();
