// While a backfill runs, the page reads itself again every five seconds and swaps in the new
// content in place (the scroll position stays). No other script runs on these pages.
(function () {
  "use strict";
  var every = 5000;
  function live(doc) {
    return doc.body && doc.body.getAttribute("data-live") === "true";
  }
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html");
        var main = next.getElementById("main");
        var footer = next.querySelector("footer");
        if (main) { document.getElementById("main").replaceWith(main); }
        if (footer) { document.querySelector("footer").replaceWith(footer); }
        document.body.setAttribute("data-live", live(next) ? "true" : "false");
      })
      .catch(function () { /* the server is away: try again later */ })
      .then(schedule);
  }
  function schedule() {
    if (live(document)) { window.setTimeout(refresh, every); }
  }
  schedule();
})();
