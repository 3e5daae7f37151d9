// Refreshes every element with data-refresh from its URL every 5 seconds,
// so the queues table moves without reloading the page. A failed fetch
// (the server or the database away) keeps the last table and tries again.
"use strict";
const REFRESH_MS = 5000;
for (const section of document.querySelectorAll("[data-refresh]")) {
  setInterval(async () => {
    try {
      const answer = await fetch(section.dataset.refresh, { cache: "no-store" });
      if (answer.ok) {
        section.innerHTML = await answer.text();
        section.dataset.refreshed = String(Date.now());
      }
    } catch (e) {
      // Keep the table; the next tick tries again.
    }
  }, REFRESH_MS);
}
