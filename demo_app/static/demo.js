// The demo's small script: times in the reader's own zone, live countdowns, and the
// UTC offset that turns a datetime-local input into an aware datetime on the server.
// Every page works without it (times are then shown and read as UTC).
(function () {
  "use strict";

  function pad(n) { return String(n).padStart(2, "0"); }

  function localise(root) {
    root.querySelectorAll("time[data-local]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) { return; }
      var opts = el.dataset.local === "time"
        ? { hour: "2-digit", minute: "2-digit", second: "2-digit" }
        : { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" };
      el.textContent = d.toLocaleString(undefined, opts);
      el.title = d.toString();
    });
    root.querySelectorAll("input[type=datetime-local][data-utc-value]").forEach(function (input) {
      var utc = input.dataset.utcValue;
      if (!utc || input.dataset.localised) { return; }
      var d = new Date(utc + ":00Z");
      if (isNaN(d)) { return; }
      input.value = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) +
        "T" + pad(d.getHours()) + ":" + pad(d.getMinutes());
      input.dataset.localised = "1";
    });
    root.querySelectorAll("[data-tz-offset]").forEach(function (hidden) {
      updateOffset(hidden.form);
    });
  }

  function relative(seconds) {
    if (seconds <= 0) { return "any moment now"; }
    var total = Math.ceil(seconds);
    if (total < 60) { return "in " + total + " s"; }
    if (total < 3600) { return "in " + Math.floor(total / 60) + " min " + pad(total % 60) + " s"; }
    var hours = Math.floor(total / 3600);
    if (hours < 48) { return "in " + hours + " h " + Math.floor((total % 3600) / 60) + " min"; }
    return "in " + Math.floor(hours / 24) + " days";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var at = Date.parse(el.dataset.countdown);
      if (!isNaN(at)) { el.textContent = relative((at - now) / 1000); }
    });
  }

  // The offset *at the chosen time*, so a date across a daylight-saving change is right.
  function updateOffset(form) {
    if (!form) { return; }
    var input = form.querySelector("input[type=datetime-local]");
    var hidden = form.querySelector("[data-tz-offset]");
    var label = form.querySelector("[data-zone-label]");
    if (!input || !hidden) { return; }
    var chosen = input.value ? new Date(input.value) : new Date();
    if (isNaN(chosen)) { chosen = new Date(); }
    var offset = chosen.getTimezoneOffset();
    hidden.value = String(offset);
    if (label) {
      var east = -offset, sign = east >= 0 ? "+" : "-", abs = Math.abs(east);
      var zone = "";
      try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { zone = ""; }
      label.textContent = "(your time" + (zone ? ", " + zone : "") + ", UTC" + sign +
        pad(Math.floor(abs / 60)) + ":" + pad(abs % 60) + ")";
    }
  }

  document.addEventListener("input", function (event) {
    if (event.target.matches && event.target.matches("input[type=datetime-local]")) {
      updateOffset(event.target.form);
    }
  });
  document.addEventListener("submit", function (event) { updateOffset(event.target); }, true);
  document.addEventListener("htmx:afterSettle", function (event) { localise(event.target); tick(); });

  // The phone nav scrolls sideways; data-more shows a fade while links lie beyond it.
  function navCue() {
    document.querySelectorAll(".nav").forEach(function (nav) {
      var more = nav.scrollWidth - nav.clientWidth - nav.scrollLeft > 2;
      nav.toggleAttribute("data-more", more);
    });
  }

  function start() {
    navCue();
    document.querySelectorAll(".nav").forEach(function (nav) {
      nav.addEventListener("scroll", navCue, { passive: true });
    });
    window.addEventListener("resize", navCue);
    localise(document);
    tick();
    setInterval(tick, 1000);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
