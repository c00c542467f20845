// sendonce console: progressive enhancement only; every page works without it.
"use strict";

// The overview refreshes its live part every few seconds while visible.
(function refresh() {
  const period = Number(document.body.dataset.refresh || 0);
  const live = document.getElementById("live");
  if (!period || !live) return;
  let busy = false;
  async function tick() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const res = await fetch(location.href, { credentials: "same-origin", redirect: "manual" });
      if (res.type === "opaqueredirect" || res.status === 401) { location.reload(); return; }
      if (!res.ok) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      const next = doc.getElementById("live");
      if (next) live.replaceChildren(...next.childNodes);
    } catch (e) {
      // The next tick tries again; the page keeps what it shows.
    } finally {
      busy = false;
    }
  }
  setInterval(tick, period);
  document.addEventListener("visibilitychange", tick);
})();

// Dead letters: select all, count the selection, and keep the preview
// button disabled while nothing is selected.
(function selection() {
  const form = document.querySelector("form.letters");
  if (!form) return;
  const all = form.querySelector("[data-select-all]");
  const boxes = () => form.querySelectorAll('input[name="id"]');
  const button = form.querySelector('[data-action="replay-preview"]');
  const count = form.querySelector("[data-selected]");
  function update() {
    const n = [...boxes()].filter((b) => b.checked).length;
    if (button) button.disabled = n === 0;
    if (count) count.textContent = n ? n + " selected" : "select rows to replay";
    if (all) all.checked = n > 0 && n === boxes().length;
  }
  if (all) all.addEventListener("change", () => { boxes().forEach((b) => { b.checked = all.checked; }); update(); });
  form.addEventListener("change", update);
  update();
})();
