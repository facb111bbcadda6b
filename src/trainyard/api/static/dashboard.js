// trainyard dashboard: a little script of our own. The pages work without it; it adds
// local times, live updates of the page, and a readout of the loss curve under the pointer.
"use strict";

// <time data-t="unix seconds"> in the browser's own time zone.
function localTimes(root) {
  for (const el of root.querySelectorAll("time[data-t]")) {
    const d = new Date(parseFloat(el.dataset.t) * 1000);
    el.title = el.textContent;
    el.textContent = d.toLocaleString();
  }
}

// Re-fetch the page every data-refresh seconds and swap <main> (paused while hidden or asked).
function liveUpdates() {
  const main = document.getElementById("live");
  const every = parseFloat(main && main.dataset.refresh || "0");
  if (!every) return;
  let paused = false;
  document.addEventListener("change", e => { if (e.target.id === "pause") paused = e.target.checked; });
  setInterval(async () => {
    if (paused || document.hidden) return;
    try {
      const r = await fetch(location.href, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}});
      if (r.redirected || !r.ok) { if (r.status === 401 || r.redirected) location.reload(); return; }
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      const fresh = doc.getElementById("live");
      if (!fresh) return;
      const log = document.getElementById("log"), logAtEnd = log && log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      main.innerHTML = fresh.innerHTML;
      main.dataset.refresh = fresh.dataset.refresh;
      const pause = document.getElementById("pause");
      if (pause) pause.checked = paused;
      const newLog = document.getElementById("log");
      if (newLog && logAtEnd) newLog.scrollTop = newLog.scrollHeight;
      localTimes(main);
      lossReadout();
    } catch (_) { /* the plane restarts: try again next time */ }
  }, every * 1000);
}

// Hovering the loss curve: the nearest step and its loss, with a cursor line.
function lossReadout() {
  const svg = document.getElementById("loss-curve"), out = document.getElementById("loss-readout");
  if (!svg || !out || !svg.dataset.steps) return;
  const steps = svg.dataset.steps.split(",").map(Number), values = svg.dataset.values.split(",").map(Number);
  const x0 = +svg.dataset.x0, x1 = +svg.dataset.x1, left = +svg.dataset.left, right = +svg.dataset.right;
  const cursor = document.createElementNS("http://www.w3.org/2000/svg", "line");
  cursor.setAttribute("class", "cursor");
  cursor.setAttribute("y1", "12"); cursor.setAttribute("y2", String(svg.viewBox.baseVal.height - 28));
  svg.addEventListener("mousemove", e => {
    const box = svg.getBoundingClientRect(), scale = svg.viewBox.baseVal.width / box.width;
    const px = (e.clientX - box.left) * scale, step = x0 + (px - left) / (right - left) * (x1 - x0);
    let lo = 0, hi = steps.length - 1;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (steps[mid] < step) lo = mid + 1; else hi = mid; }
    const i = lo > 0 && Math.abs(steps[lo - 1] - step) < Math.abs(steps[lo] - step) ? lo - 1 : lo;
    const cx = left + (steps[i] - x0) / (x1 - x0) * (right - left);
    cursor.setAttribute("x1", String(cx)); cursor.setAttribute("x2", String(cx));
    if (!cursor.parentNode) svg.appendChild(cursor);
    out.textContent = `step ${steps[i]}: loss ${Number(values[i].toPrecision(6))}`;
  });
  svg.addEventListener("mouseleave", () => { cursor.remove(); out.textContent = ""; });
}

document.addEventListener("DOMContentLoaded", () => { localTimes(document); liveUpdates(); lossReadout(); });
