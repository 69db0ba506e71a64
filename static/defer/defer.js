/* flask_defer: the Undo toasts' behaviour in the browser.
 *
 * Every toast (and every row of the pending page) carries data-defer-state, one of
 * open | waiting | done | failed | undone, rendered by the server. This script never
 * decides an outcome: it counts the server's remaining seconds down (open → waiting
 * at zero, a neutral "Sending…"), and only a server answer moves an element to done,
 * failed or undone.
 *
 * Cost: while some element is waiting, it asks GET <state-url>?id=… every 250 ms
 * (750 ms after 20 s of waiting); while some are open (an operator may cancel the job
 * meanwhile, or it may settle otherwise), every 750 ms; it stops as soon as nothing is
 * open or waiting, so an idle page makes no requests. When a job settles it fires `defer:settled` on <body>
 * (detail: id, key, status), so app fragments can hx-trigger="defer:settled from:body".
 *
 * Hovering or focusing an open toast holds its countdown and asks the server (POST
 * <hold-url>, once a second) to keep the window open; the server caps the extension
 * (DEFER_UNDO_MAX_HOLD), and the countdown resumes when it says so or on leaving.
 *
 * Keys: Z undoes the newest open toast (not while typing); F6 moves focus to the
 * toasts and back; Escape dismisses the newest settled toast. Focus returns to where
 * it was. No inline script or style is needed, so it works under a strict CSP.
 */
(function () {
  "use strict";
  if (window.flaskDefer) { return; }

  var SETTLED_LINGER_MS = 6000;
  var OUTCOME_LINGER_MS = 8000;
  var TICK_MS = 200;
  var POLL_FAST_MS = 250;
  var POLL_SLOW_MS = 750;
  var POLL_OPEN_MS = 750;
  var FAST_FOR_MS = 20000;
  var HOLD_BEAT_MS = 1000;
  var HOLD_SLACK_S = 1.5; // the server's window outlives a missed heartbeat
  var MAX_TIMER_S = 86400;
  var DISMISSED_KEY = "flask_defer.dismissed";
  var ANNOUNCED_KEY = "flask_defer.announced";
  var SETTLED = { done: true, failed: true, undone: true };

  var ticker = null;
  var pollTimer = null;
  var pollInFlight = false;
  var waitingSince = null;
  var settledFired = {};
  var returnFocus = null;

  function now() { return performance.now(); }
  function each(list, fn) { Array.prototype.forEach.call(list, fn); }

  /* When the page's HTML arrived: the moment the server's remaining seconds refer to. */
  function navigationAnchor() {
    var entries = performance.getEntriesByType ? performance.getEntriesByType("navigation") : [];
    var nav = entries && entries[0];
    if (nav && nav.responseStart > 0 && nav.responseStart <= now()) { return nav.responseStart; }
    return now();
  }

  function region() { return document.querySelector("[data-defer-toasts]"); }
  function list() { var r = region(); return r && r.querySelector("[data-defer-list]"); }

  function locale() {
    var r = region();
    return (r && r.getAttribute("data-defer-locale")) || document.documentElement.lang ||
      navigator.language || undefined;
  }
  function formatNumber(n) {
    try { return new Intl.NumberFormat(locale()).format(n); } catch (e) { return String(n); }
  }

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

  /* ---- states ---- */

  function stateOf(el) { return el.getAttribute("data-defer-state"); }
  function textFor(el, state) { return el.getAttribute("data-defer-text-" + state); }
  function isToast(el) { return el.classList.contains("defer-toast"); }

  function setState(el, state, text) {
    var previous = stateOf(el);
    el.setAttribute("data-defer-state", state);
    if (isToast(el)) {
      if (previous) { el.classList.remove("defer-toast--" + previous); }
      el.classList.add("defer-toast--" + state);
    }
    var target = el.querySelector("[data-defer-text]");
    if (target && text) { target.textContent = text; }
  }

  function removeForm(el) {
    var form = el.querySelector(".defer-toast__form, [data-defer-row-form]");
    if (!form) { return; }
    var hadFocus = form.contains(document.activeElement);
    form.parentNode.removeChild(form);
    if (hadFocus) {
      var close = el.querySelector("[data-defer-dismiss]");
      if (close && !close.hidden) { close.focus({ preventScroll: true }); } else { restoreFocus(); }
    }
  }

  /* The window closed by the clock: the outcome is not known yet, so say nothing of it. */
  function toWaiting(el) {
    if (stateOf(el) !== "open") { return; }
    releaseHold(el);
    setState(el, "waiting", textFor(el, "waiting"));
    removeForm(el);
    schedulePoll();
  }

  /* The server says the job settled: show its text, tell the page, then fade. */
  function settle(el, job) {
    releaseHold(el);
    var text = job.text || textFor(el, job.state);
    setState(el, job.state, text);
    removeForm(el);
    if (fireSettled(job)) { announce(text); }
    if (isToast(el)) { lingerThenDismiss(el, SETTLED_LINGER_MS); }
  }

  /* Tell the page (once per job) that a job of its owner settled. */
  function fireSettled(job) {
    if (settledFired[job.id]) { return false; }
    settledFired[job.id] = true;
    document.body.dispatchEvent(new CustomEvent("defer:settled", {
      bubbles: true,
      detail: { id: job.id, key: job.key, status: job.status }
    }));
    return true;
  }

  /* ---- toasts and rows ---- */

  function showClose(toast) {
    var close = toast.querySelector("[data-defer-dismiss]");
    if (close) { close.hidden = false; }
  }

  function dismiss(toast) {
    if (!toast || toast.__deferLeaving) { return; }
    toast.__deferLeaving = true;
    var hadFocus = toast.contains(document.activeElement);
    releaseHold(toast);
    if (toast.__defer) { remember(DISMISSED_KEY, toast.getAttribute("data-defer-toast")); }
    toast.classList.add("defer-toast--leaving");
    setTimeout(function () {
      if (toast.parentNode) { toast.parentNode.removeChild(toast); }
      if (hadFocus) { restoreFocus(); }
    }, 250);
  }

  /* Fade a settled toast after a while, but never under the pointer or the focus. */
  function lingerThenDismiss(toast, ms) {
    if (toast.__deferLinger) { return; }
    toast.__deferLinger = true;
    var at = now() + ms;
    (function check() {
      if (!toast.parentNode) { return; }
      var busy = toast.matches(":hover") || toast.contains(document.activeElement);
      if (!busy && now() >= at) { dismiss(toast); return; }
      setTimeout(check, busy ? 500 : Math.max(at - now(), 50));
    })();
  }

  function initWatched(el, anchor) {
    if (el.__defer) { return; }
    var id = el.getAttribute("data-defer-watch") || el.getAttribute("data-defer-toast");
    if (isToast(el) && el.hasAttribute("data-defer-toast") &&
        remembered(DISMISSED_KEY).indexOf(id) !== -1) {
      el.parentNode.removeChild(el);
      return;
    }
    var remaining = parseFloat(el.getAttribute("data-defer-remaining")) || 0;
    el.__defer = {
      id: id,
      deadline: remaining > MAX_TIMER_S ? Infinity : anchor + remaining * 1000,
      window: parseFloat(el.getAttribute("data-defer-window")) || remaining || 1,
      held: false, frozen: 0, hover: false, focus: false, capped: false, beat: null
    };
    if (isToast(el)) { showClose(el); }
    var state = stateOf(el);
    if (state === "open") {
      if (isToast(el)) {
        el.classList.add("defer-toast--timed");
        wireHold(el);
        if (remembered(ANNOUNCED_KEY).indexOf(id) === -1) {
          remember(ANNOUNCED_KEY, id);
          announce(textFor(el, "announce"));
        }
      }
      update(el);
      startTicking();
      schedulePoll();
    } else if (state === "waiting") {
      schedulePoll();
    } else if (SETTLED[state] && isToast(el)) {
      lingerThenDismiss(el, SETTLED_LINGER_MS);
    }
  }

  function secondsLeft(el) {
    var state = el.__defer;
    if (state.held) { return state.frozen; }
    return Math.max((state.deadline - now()) / 1000, 0);
  }

  function update(el) {
    if (!el.__defer || stateOf(el) !== "open") { return; }
    // Once Undo is asked, the server's answer decides, not the clock.
    if (el.getAttribute("data-defer-busy")) { return; }
    var left = secondsLeft(el);
    if (left <= 0) { toWaiting(el); return; }
    var count = el.querySelector("[data-defer-count]");
    var shown = formatNumber(Math.ceil(left));
    if (count && count.textContent !== shown) { count.textContent = shown; }
    var bar = el.querySelector(".defer-toast__bar");
    if (bar) {
      bar.style.transform = "scaleX(" + Math.min(left / el.__defer.window, 1) + ")";
    }
  }

  function watched() { return document.querySelectorAll("[data-defer-watch]"); }

  function openOnes() {
    return Array.prototype.filter.call(watched(), function (el) {
      return el.__defer && stateOf(el) === "open" && el.__defer.deadline !== Infinity;
    });
  }

  function startTicking() {
    if (ticker !== null) { return; }
    ticker = setInterval(function () {
      var open = openOnes();
      open.forEach(update);
      if (!open.length) { clearInterval(ticker); ticker = null; }
    }, TICK_MS);
  }

  function initAll(root, anchor) {
    var scope = root || document;
    each(scope.querySelectorAll(".defer-toast--outcome"), initOutcome);
    each(scope.querySelectorAll("[data-defer-watch]"), function (el) { initWatched(el, anchor); });
    each(scope.querySelectorAll("time[data-defer-local-time]"), localTime);
  }

  function localTime(el) {
    var when = new Date(el.getAttribute("datetime"));
    if (isNaN(when.getTime())) { return; }
    try {
      el.textContent = "(" + new Intl.DateTimeFormat(locale(), {
        dateStyle: "medium", timeStyle: "short"
      }).format(when) + ")";
    } catch (e) { /* no Intl: the relative time alone says it */ }
  }

  function initOutcome(toast) {
    if (toast.__deferOutcome) { return; }
    toast.__deferOutcome = true;
    showClose(toast);
    var text = toast.querySelector("[data-defer-text]");
    announce(text ? text.textContent.trim() : "");
    var jobId = toast.getAttribute("data-defer-job");
    if (jobId && SETTLED[stateOf(toast)]) {
      fireSettled({
        id: parseInt(jobId, 10),
        key: toast.getAttribute("data-defer-key") || null,
        status: toast.getAttribute("data-defer-status")
      });
    }
    if (toast.hasAttribute("data-defer-watch") && stateOf(toast) === "waiting") {
      initWatched(toast, now());
    } else {
      lingerThenDismiss(toast, OUTCOME_LINGER_MS);
    }
  }

  /* ---- learning the outcome: short polling, only while something waits ---- */

  function waitingIds() {
    var ids = [];
    each(watched(), function (el) {
      var id = el.getAttribute("data-defer-watch");
      if (el.__defer && stateOf(el) === "waiting" && ids.indexOf(id) === -1) { ids.push(id); }
    });
    return ids;
  }

  /* Open toasts too: what the server knows of them can change without this page (an
     operator's cancel), and their owner must learn it while the toast is up. Only
     toasts, whose window is seconds long: a pending page's row of a job due next
     week would otherwise keep an idle page asking for a week. */
  function openIds() {
    var ids = [];
    each(watched(), function (el) {
      var id = el.getAttribute("data-defer-watch");
      if (el.__defer && isToast(el) && stateOf(el) === "open" &&
          !el.getAttribute("data-defer-busy") &&
          ids.indexOf(id) === -1) { ids.push(id); }
    });
    return ids;
  }

  function watchedIds() {
    var ids = waitingIds();
    openIds().forEach(function (id) { if (ids.indexOf(id) === -1) { ids.push(id); } });
    return ids;
  }

  function schedulePoll() {
    if (pollTimer !== null || pollInFlight) { return; }
    var waiting = waitingIds().length > 0;
    if (!waiting) { waitingSince = null; }
    if (!waiting && !openIds().length) { return; }
    if (document.visibilityState === "hidden") { return; } // resumed on visibilitychange
    var delay = POLL_OPEN_MS;
    if (waiting) {
      if (waitingSince === null) { waitingSince = now(); }
      delay = now() - waitingSince < FAST_FOR_MS ? POLL_FAST_MS : POLL_SLOW_MS;
    }
    pollTimer = setTimeout(poll, delay);
  }

  function poll() {
    pollTimer = null;
    var r = region();
    var ids = watchedIds();
    if (!r || !ids.length || !window.fetch) { waitingSince = null; return; }
    pollInFlight = true;
    var url = r.getAttribute("data-defer-state-url") + "?" +
      ids.map(function (id) { return "id=" + encodeURIComponent(id); }).join("&");
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("toast states: HTTP " + response.status); }
        return response.json();
      })
      .then(function (data) { applyStates(ids, data.jobs || []); })
      .catch(function () { /* try again on the next round */ })
      .then(function () { pollInFlight = false; schedulePoll(); });
  }

  function applyStates(ids, jobs) {
    var byId = {};
    jobs.forEach(function (job) { byId[String(job.id)] = job; });
    each(watched(), function (el) {
      var id = el.getAttribute("data-defer-watch");
      var state = stateOf(el);
      if (ids.indexOf(id) === -1 || (state !== "waiting" && state !== "open")) { return; }
      // An Undo is being asked: its answer decides, not this poll.
      if (el.getAttribute("data-defer-busy")) { return; }
      var job = byId[id];
      // Gone, or not this owner's any more (signed out): stop asking about it (an
      // open one keeps counting down and is asked about again once it waits).
      if (!job) { if (state === "waiting") { el.removeAttribute("data-defer-watch"); } return; }
      if (SETTLED[job.state]) { settle(el, job); }
      // The server says the window closed (an operator's "Run now", a hold that came
      // too late): stop offering Undo, whatever the countdown here says.
      else if (state === "open" && job.state === "waiting" && !el.hasAttribute("data-defer-row")) {
        toWaiting(el);
      }
    });
  }

  /* ---- hold on hover and focus ---- */

  function wireHold(toast) {
    if (!toast.getAttribute("data-defer-hold-url")) { return; }
    toast.addEventListener("mouseenter", function () { toast.__defer.hover = true; holdIfNeeded(toast); });
    toast.addEventListener("mouseleave", function () { toast.__defer.hover = false; holdIfNeeded(toast); });
    toast.addEventListener("focusin", function () { toast.__defer.focus = true; holdIfNeeded(toast); });
    toast.addEventListener("focusout", function (event) {
      if (event.relatedTarget && toast.contains(event.relatedTarget)) { return; }
      toast.__defer.focus = false;
      holdIfNeeded(toast);
    });
  }

  function holdIfNeeded(toast) {
    var s = toast.__defer;
    var want = (s.hover || s.focus) && !s.capped && stateOf(toast) === "open";
    if (want && !s.held) {
      s.frozen = secondsLeft(toast);
      if (s.frozen <= 0) { return; }
      s.held = true;
      toast.classList.add("defer-toast--held");
      sendHold(toast);
      s.beat = setInterval(function () { sendHold(toast); }, HOLD_BEAT_MS);
    } else if (!want && s.held) {
      releaseHold(toast);
    }
  }

  /* Resume counting from where the hold froze it (or from the server's *left*). */
  function releaseHold(toast, left) {
    var s = toast.__defer;
    if (!s || !s.held) { return; }
    if (s.beat !== null) { clearInterval(s.beat); s.beat = null; }
    s.held = false;
    s.deadline = now() + (left === undefined ? s.frozen : left) * 1000;
    toast.classList.remove("defer-toast--held");
  }

  function sendHold(toast) {
    var s = toast.__defer;
    if (!s.held || stateOf(toast) !== "open" || s.holdInFlight) { return; }
    s.holdInFlight = true;
    var body = "seconds=" + encodeURIComponent((s.frozen + HOLD_SLACK_S).toFixed(3));
    fetch(toast.getAttribute("data-defer-hold-url"), {
      method: "POST",
      credentials: "same-origin",
      cache: "no-store",
      headers: {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-CSRFToken": toast.getAttribute("data-defer-csrf") || "",
        Accept: "application/json"
      },
      body: body
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (response.ok && data.capped) {
          // The server will not hold longer: count down what it still keeps open.
          s.capped = true;
          toast.classList.add("defer-toast--capped");
          releaseHold(toast, Math.max(data.seconds_left - HOLD_SLACK_S, 0));
        } else if (response.status === 409) {
          // The window closed on the server (or the job left pending): wait for it.
          releaseHold(toast, 0);
          toWaiting(toast);
        } else if (!response.ok) {
          releaseHold(toast); // not held on the server: do not pretend it is
          s.capped = true;
        }
      });
    }).catch(function () {
      releaseHold(toast);
    }).then(function () { s.holdInFlight = false; });
  }

  /* ---- Undo ---- */

  function openToasts() {
    var l = list();
    if (!l) { return []; }
    return Array.prototype.filter.call(l.querySelectorAll("[data-defer-toast]"), function (t) {
      return stateOf(t) === "open" && !t.getAttribute("data-defer-busy") && !t.__deferLeaving;
    });
  }

  function submitUndo(toast) {
    var form = toast.querySelector(".defer-toast__form");
    if (!form || toast.getAttribute("data-defer-busy")) { return; }
    var button = form.querySelector("button[type=submit]");
    if (form.requestSubmit) { form.requestSubmit(button); } else { form.submit(); }
  }

  function undoNewest() {
    var open = openToasts();
    if (!open.length) { return false; }
    submitUndo(open[open.length - 1]);
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

  /* ---- keyboard: F6 into the toasts and back, Escape, Z ---- */

  function restoreFocus() {
    var target = returnFocus;
    returnFocus = null;
    if (target && target.isConnected && typeof target.focus === "function") {
      target.focus({ preventScroll: true });
    } else if (document.activeElement && document.activeElement !== document.body &&
               !document.activeElement.isConnected) {
      document.body.focus();
    }
  }

  function focusToasts() {
    var r = region();
    var l = list();
    if (!r || !l) { return false; }
    var items = l.querySelectorAll(".defer-toast:not(.defer-toast--leaving)");
    var newest = items[items.length - 1];
    var target = newest && (newest.querySelector(".defer-toast__undo") ||
      newest.querySelector("[data-defer-dismiss]:not([hidden])"));
    if (!r.contains(document.activeElement)) { returnFocus = document.activeElement; }
    (target || r).focus({ preventScroll: true });
    return true;
  }

  function newestSettled() {
    var l = list();
    if (!l) { return null; }
    var items = Array.prototype.filter.call(l.querySelectorAll(".defer-toast"), function (t) {
      return !t.__deferLeaving && (SETTLED[stateOf(t)] || t.classList.contains("defer-toast--outcome"));
    });
    return items[items.length - 1] || null;
  }

  function onKey(event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) { return; }
    var r = region();
    if (event.key === "F6") {
      if (r && r.contains(document.activeElement) && document.activeElement !== document.body) {
        restoreFocus();
        event.preventDefault();
      } else if (focusToasts()) {
        event.preventDefault();
      }
      return;
    }
    if (event.key === "Escape") {
      var settled = newestSettled();
      if (settled) { dismiss(settled); event.preventDefault(); }
      else if (r && r.contains(document.activeElement)) { restoreFocus(); event.preventDefault(); }
      return;
    }
    if (event.repeat || (event.key !== "z" && event.key !== "Z")) { return; }
    if (isTyping(event.target)) { return; }
    if (undoNewest()) { event.preventDefault(); }
  }

  function onFocusIn(event) {
    // Tabbing (or clicking) into the toasts: remember where focus came from.
    var r = region();
    if (r && r.contains(event.target) && event.relatedTarget && !r.contains(event.relatedTarget)) {
      returnFocus = event.relatedTarget;
    }
  }

  /* ---- htmx Undo ---- */

  function toastOf(event) {
    var elt = event.detail && event.detail.elt;
    return elt && elt.closest ? elt.closest(".defer-toast") : null;
  }

  function onBeforeRequest(event) {
    var toast = toastOf(event);
    if (!toast) { return; }
    releaseHold(toast); // the Undo answer decides now; stop asking to hold
    toast.setAttribute("data-defer-busy", "1");
    toast.classList.add("defer-toast--asking");
  }

  function onAfterRequest(event) {
    var toast = toastOf(event);
    if (toast) { toast.removeAttribute("data-defer-busy"); toast.classList.remove("defer-toast--asking"); }
  }

  function showError(toast, key, fallback) {
    var text = (region() && region().getAttribute("data-defer-error-" + key)) || fallback;
    var target = toast.querySelector("[data-defer-text]");
    if (target) { target.textContent = text; }
    toast.classList.add("defer-toast--error");
    announce(text);
  }

  function onResponseError(event) {
    var toast = toastOf(event);
    if (!toast) { return; }
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    if (status === 404) {
      showError(toast, "gone", "This can no longer be undone here.");
    } else if (status === 400 || status === 403) {
      showError(toast, "session", "Your session changed: reload the page and try again.");
    } else {
      showError(toast, "server", "Could not undo. Try again.");
    }
  }

  function onSendError(event) {
    var toast = toastOf(event);
    if (toast) { showError(toast, "network", "Could not reach the server. Try again."); }
  }

  function isOutcome(elt) {
    return !!(elt && elt.classList && elt.classList.contains("defer-toast--outcome"));
  }

  /* The Undo button that had the focus is gone with its toast: put the focus on the
     outcome that took its place, so Escape finds it there and gives it back. */
  function keepFocus(outcome) {
    var active = document.activeElement;
    if (outcome.__deferLeaving || (active && active !== document.body && active.isConnected)) {
      return;
    }
    var close = outcome.querySelector("[data-defer-dismiss]");
    if (close) { close.hidden = false; close.focus({ preventScroll: true }); }
  }

  /* htmx fires afterSwap on the new outcome in the same task as the swap, before the
     page is painted; its load event only comes after the settle delay (20 ms, far more
     on a busy machine). Taking the focus here leaves no moment in which the outcome is
     on screen with the focus nowhere: an Escape pressed then used to dismiss it without
     returning the focus. */
  function onAfterSwap(event) {
    if (isOutcome(event.target)) { keepFocus(event.target); }
  }

  function onLoad(event) {
    var elt = event.detail && event.detail.elt;
    if (!isOutcome(elt)) { return; }
    initOutcome(elt);
    keepFocus(elt);
  }

  /* ---- refreshing from the server ---- */

  function merge(html, anchor) {
    var l = list();
    if (!l) { return; }
    var template = document.createElement("template");
    template.innerHTML = html;
    var fresh = {};
    each(template.content.querySelectorAll("[data-defer-toast]"), function (t) {
      var id = t.getAttribute("data-defer-toast");
      fresh[id] = true;
      var existing = l.querySelector('[data-defer-toast="' + id + '"]');
      if (existing) {
        if (existing.__defer && stateOf(existing) === "open" && !existing.__defer.held) {
          // Re-anchor on the server's clock (after a sleep, a bfcache restore ...).
          existing.__defer.deadline = anchor + (parseFloat(t.getAttribute("data-defer-remaining")) || 0) * 1000;
        }
        return;
      }
      l.appendChild(t);
      if (window.htmx) { window.htmx.process(t); }
      initWatched(t, anchor);
    });
    // An open toast the fragment left out may be closed on the server (undone in
    // another tab) or only past DEFER_TOAST_LIMIT: ask the server now, and let its
    // answer decide (applyStates), not the fragment's length.
    if (openToasts().some(function (t) { return !fresh[t.getAttribute("data-defer-toast")]; })) {
      schedulePoll();
    }
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

  /* ---- the stack on small screens: collapsed, and never over the page's end ---- */

  var NARROW = "(max-width: 30rem)";
  var expanded = false;
  var basePadding = null;

  function liveToasts() {
    var l = list();
    if (!l) { return []; }
    return Array.prototype.filter.call(l.querySelectorAll(".defer-toast"), function (t) {
      return !t.classList.contains("defer-toast--leaving");
    });
  }

  /* On a phone, show the newest toast and "+2 more" for the others (a tap expands
     them); then pad the body by the stack's height, so the page's last rows and its
     Send button can be scrolled clear of it. */
  function layoutStack() {
    var r = region();
    if (!r) { return; }
    var toasts = liveToasts();
    var more = r.querySelector("[data-defer-more]");
    var narrow = window.matchMedia ? window.matchMedia(NARROW).matches : false;
    var collapse = narrow && toasts.length > 1;
    if (toasts.length < 2) { expanded = false; }
    toasts.forEach(function (t, i) {
      t.classList.toggle("defer-toast--stacked", i < toasts.length - 1);
    });
    r.classList.toggle("defer-toasts--collapsed", collapse && !expanded);
    if (more) {
      more.hidden = !collapse;
      more.setAttribute("aria-expanded", expanded ? "true" : "false");
      var text = expanded ? more.getAttribute("data-defer-text-fewer")
        : (more.getAttribute("data-defer-text-more") || "+{count}")
            .replace("{count}", formatNumber(toasts.length - 1));
      if (more.textContent !== text) { more.textContent = text; }
    }
    padBody(r, toasts.length > 0);
  }

  function padBody(r, any) {
    var body = document.body;
    if (basePadding === null) {
      basePadding = parseFloat(getComputedStyle(body).paddingBottom) || 0;
    }
    if (!any) { body.style.paddingBottom = ""; return; }
    var box = r.getBoundingClientRect();
    var gap = Math.max(window.innerHeight - box.bottom, 0);
    body.style.paddingBottom = Math.ceil(basePadding + box.height + 2 * gap) + "px";
  }

  function watchStack() {
    var r = region();
    var l = list();
    if (!r || !l) { return; }
    var queued = false;
    function soon() {
      if (queued) { return; }
      queued = true;
      requestAnimationFrame(function () { queued = false; layoutStack(); });
    }
    new MutationObserver(soon).observe(l, {
      childList: true, subtree: true, attributes: true, attributeFilter: ["class"]
    });
    if (window.ResizeObserver) { new ResizeObserver(soon).observe(l); }
    window.addEventListener("resize", soon);
    var more = r.querySelector("[data-defer-more]");
    if (more) {
      more.addEventListener("click", function () { expanded = !expanded; layoutStack(); });
    }
    layoutStack();
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
    initAll(document, navigationAnchor());
    watchStack();
    var entries = performance.getEntriesByType ? performance.getEntriesByType("navigation") : [];
    if (entries[0] && entries[0].type === "back_forward") { refresh(); }
  }

  document.addEventListener("keydown", onKey);
  document.addEventListener("focusin", onFocusIn);
  document.addEventListener("defer-toasts", refresh);
  document.addEventListener("htmx:beforeRequest", onBeforeRequest);
  document.addEventListener("htmx:afterRequest", onAfterRequest);
  document.addEventListener("htmx:responseError", onResponseError);
  document.addEventListener("htmx:sendError", onSendError);
  document.addEventListener("htmx:afterSwap", onAfterSwap);
  document.addEventListener("htmx:load", onLoad);
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") { refresh(); schedulePoll(); }
  });
  window.addEventListener("pageshow", function (event) { if (event.persisted) { refresh(); } });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }

  window.flaskDefer = { refresh: refresh, undoNewest: undoNewest, focusToasts: focusToasts };
})();
