// Refreshes every element with data-refresh from its URL every 5 seconds,
// so the queues table moves without reloading the page. A failed refresh
// (the server or the database away) keeps the last table, says since when
// it is stale and why in the element's p.stale, and tries again.
"use strict";
const REFRESH_MS = 5000;

// The title of an error page, or its status line.
function reason(answer, text) {
  const title = new DOMParser().parseFromString(text, "text/html").querySelector("h1");
  return title ? title.textContent : `HTTP ${answer.status}`;
}

for (const section of document.querySelectorAll("[data-refresh]")) {
  const note = document.querySelector(`p.stale[data-for="${section.id}"]`);
  let refreshed = new Date();
  const stale = (why) => {
    if (note) {
      note.textContent = `Not refreshed since ${refreshed.toLocaleTimeString()}: ${why}`;
      note.hidden = false;
    }
  };
  setInterval(async () => {
    try {
      const answer = await fetch(section.dataset.refresh, { cache: "no-store" });
      const text = await answer.text();
      if (!answer.ok) {
        stale(reason(answer, text));
        return;
      }
      section.innerHTML = text;
      refreshed = new Date();
      section.dataset.refreshed = String(refreshed.getTime());
      if (note) note.hidden = true;
    } catch (e) {
      stale("the dashboard does not answer");
    }
  }, REFRESH_MS);
}
