// The live cluster page: polls /ui/api/cluster every second and draws it.
// Plain DOM and SVG, no library, nothing loaded from anywhere but this server.
"use strict";

const QUIET = { "X-Quire-Page": "1" };
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#4a7bd0", "#d0674a", "#3a9d5d", "#9b59b6", "#c9a227", "#2c98a0", "#7f8c8d"];
let csrfToken = null;
let timer = null;

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : Math.round(n)) + " " + units[i];
}

function rate(n) { return n >= 100 ? Math.round(n).toString() : n.toFixed(1); }

function badge(text, kind) { return el("span", { class: "badge " + (kind || text) }, text); }

function fill(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c)))));
}

// A line chart of named series over time: series = {name: [[t, v], ...]}.
function lineChart(container, title, series, format) {
  const width = 800, height = 140, left = 60, bottom = 18;
  const box = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  const names = Object.keys(series);
  const points = names.flatMap((n) => series[n]);
  const t0 = Math.min(...points.map((p) => p[0]), Date.now() - 60000);
  const t1 = Math.max(...points.map((p) => p[0]), t0 + 1);
  const vmax = Math.max(1, ...points.map((p) => p[1]));
  const x = (t) => left + (width - left - 10) * (t - t0) / (t1 - t0);
  const y = (v) => height - bottom - (height - bottom - 10) * v / vmax;
  box.append(svg("line", { x1: left, y1: y(0), x2: width - 10, y2: y(0), stroke: "#ccd" }));
  const label = svg("text", { x: 4, y: 14 });
  label.textContent = format(vmax);
  const title_ = svg("text", { x: left, y: height - 4 });
  title_.textContent = title + " (last " + Math.round((t1 - t0) / 1000) + " s)";
  box.append(label, title_);
  names.forEach((name, i) => {
    const path = series[name].map((p, j) => (j ? "L" : "M") + x(p[0]).toFixed(1) + " " +
      y(p[1]).toFixed(1)).join(" ");
    if (path) box.append(svg("path", { d: path, fill: "none", stroke: COLORS[i % COLORS.length],
      "stroke-width": 1.5 }));
  });
  const legend = el("div", { class: "legend" }, ...names.map((n, i) => {
    const swatch = el("span", {}, "■ ");
    swatch.style.color = COLORS[i % COLORS.length];
    return el("span", {}, swatch, n + "  ");
  }));
  container.replaceChildren(box, legend);
}

// The scaling history: one column per epoch, its segments' key ranges stacked.
function scalingPicture(epochs) {
  const width = 160, height = 40;
  const box = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": epochs.length + " epochs" });
  const w = width / Math.max(1, epochs.length);
  epochs.forEach((epoch, i) => {
    epoch.segments.forEach(([lo, hi], j) => {
      box.append(svg("rect", { x: (i * w).toFixed(1), y: (lo * height).toFixed(1),
        width: Math.max(1, w - 1).toFixed(1), height: Math.max(1, (hi - lo) * height - 1).toFixed(1),
        fill: COLORS[j % COLORS.length] }));
    });
  });
  return box;
}

function history(snapshot, group, key) {
  const series = {};
  for (const sample of snapshot.history) {
    for (const [name, values] of Object.entries(sample[group] || {})) {
      (series[name] = series[name] || []).push([sample.time_ms, values[key]]);
    }
  }
  return series;
}

async function sealStream(name) {
  const [scope, stream] = name.split("/");
  const answer = await fetch(`/v1/scopes/${encodeURIComponent(scope)}/streams/` +
    `${encodeURIComponent(stream)}/state`, {
    method: "PUT", credentials: "same-origin",
    headers: { ...QUIET, "Content-Type": "application/json",
      ...(csrfToken ? { "X-CSRF-Token": csrfToken } : {}) },
    body: JSON.stringify({ streamState: "SEALED" }) });
  if (!answer.ok) $("status").textContent = "seal failed: " + (await answer.json()).error;
}

function draw(s) {
  const up = s.bookies.filter((b) => b.state !== "down").length;
  $("summary").textContent = `${up}/${s.bookies.length} bookies up · ` +
    `${s.segment_stores.length} segment stores · ${s.streams.length} streams`;
  fill($("bookies").tBodies[0], s.bookies.map((b) => {
    const used = b.total_bytes ? 1 - b.free_bytes / b.total_bytes : null;
    const bar = el("span", { class: "bar" }, el("span"));
    if (used !== null) bar.firstChild.style.width = (100 * used).toFixed(0) + "%";
    return [b.id, badge(b.state), b.address || "–",
      used === null ? "–" : el("span", {}, bar, (100 * used).toFixed(0) + "%"),
      b.ledgers ?? "–", rate(b.entries_per_s), bytes(b.entry_log_bytes_per_s) + "/s",
      bytes(b.journal_bytes_per_s) + "/s"];
  }));
  lineChart($("bookie-chart"), "journal bytes/s by bookie",
    history(s, "bookies", "journal_bytes_per_s"), bytes);
  fill($("stores").tBodies[0], s.segment_stores.map((st) => {
    const failed = st.containers.filter((c) => c.failure).length + st.degraded_containers;
    return [st.id, st.address || "–", st.containers.map((c) => c.id).join(", ") || "none",
      st.containers.reduce((a, c) => a + c.tier1Frames, 0),
      bytes(st.containers.reduce((a, c) => a + (c.tier2BacklogBytes || 0), 0)),
      st.error ? badge("unreachable", "down") : badge(failed ? "failing" : "ok",
        failed ? "failed" : "ok"),
      bytes(st.containers.reduce((a, c) => a + c.readIndexBytes, 0))];
  }));
  const backlog = { "tier-2 backlog": s.history.map((h) => [h.time_ms, h.tier2_backlog_bytes]) };
  lineChart($("backlog-chart"), "tier-2 backlog (bytes)", backlog, bytes);
  fill($("streams").tBodies[0], s.streams.map((t) => {
    const seal = el("button", { type: "button" }, "Seal");
    seal.disabled = t.state !== "active";
    seal.addEventListener("click", () => sealStream(t.name));
    const groups = t.reader_groups.map((g) => `${g.name} (${bytes(g.lag_bytes)})`).join(", ");
    const retention = t.retention.type === "none" ? "none" :
      t.retention.type === "size" ? bytes(t.retention.param) :
        Math.round(t.retention.param / 60000) + " min";
    return [t.name, badge(t.state), t.segments, rate(t.events_per_s),
      bytes(t.bytes_per_s) + "/s", retention, groups || "–", scalingPicture(t.epochs), seal];
  }));
  lineChart($("stream-chart"), "events/s by stream", history(s, "streams", "events_per_s"), rate);
  const ar = s.autorecovery;
  $("autorecovery").replaceChildren(el("p", {},
    `auditor: ${ar.auditor || "none"} · lost bookies: ${(ar.lost_bookies || []).join(", ") ||
      "none"} · under-replicated ledgers: ${ar.under_replicated_count ?? 0}`));
  $("errors").replaceChildren(...(s.errors.length ? s.errors : [{ message: "none" }]).slice(0, 12)
    .map((e) => el("li", {}, e.time_ms ? new Date(e.time_ms).toLocaleTimeString() + " " +
      e.level + " " + e.message : e.message)));
  $("status").textContent = "updated " + new Date(s.time_ms || Date.now()).toLocaleTimeString();
}

async function refresh() {
  try {
    const answer = await fetch("/ui/api/cluster", { credentials: "same-origin", headers: QUIET });
    if (answer.status === 401) { showLogin(); return; }
    draw(await answer.json());
  } catch (e) {
    $("status").textContent = "cannot reach the controller: " + e;
  }
}

function showLogin() {
  if (timer) { clearInterval(timer); timer = null; }
  $("content").classList.add("hidden");
  $("logout").classList.add("hidden");
  $("login").classList.remove("hidden");
  $("who").textContent = "";
}

function showPage(user) {
  $("login").classList.add("hidden");
  $("content").classList.remove("hidden");
  $("who").textContent = user ? "logged in as " + user : "";
  $("logout").classList.toggle("hidden", !user);
  refresh();
  if (!timer) timer = setInterval(refresh, 1000);
}

async function start() {
  $("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    const answer = await fetch("/ui/login", { method: "POST", credentials: "same-origin",
      headers: { ...QUIET, "Content-Type": "application/json" },
      body: JSON.stringify({ username: $("username").value, password: $("password").value }) });
    const body = await answer.json();
    if (!answer.ok) { $("login-error").textContent = body.error; return; }
    csrfToken = body.csrfToken;
    $("password").value = "";
    showPage(body.user);
  });
  $("logout").addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", credentials: "same-origin",
      headers: { ...QUIET, "X-CSRF-Token": csrfToken || "" } });
    csrfToken = null;
    showLogin();
  });
  const answer = await fetch("/ui/api/session", { credentials: "same-origin", headers: QUIET });
  if (answer.status === 401) { showLogin(); return; }
  const session = await answer.json();
  csrfToken = session.csrfToken;
  showPage(session.user);
}

document.addEventListener("DOMContentLoaded", start);
