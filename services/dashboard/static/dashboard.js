// The dashboard page: one EventSource on /api/events; every message is the whole cluster
// summary (bounded in size), rendered into the page. No framework, no build step.
"use strict";

const $ = (id) => document.getElementById(id);

function text(id, value) { $(id).textContent = value; }

function cpu(milli) { return milli >= 1000 ? `${(milli / 1000).toFixed(milli % 1000 ? 1 : 0)}` : `${milli}m`; }

function bytes(n) {
  const units = ["B", "Ki", "Mi", "Gi", "Ti"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(n >= 10 || i === 0 ? 0 : 1)}${units[i]}`;
}

function ms(value) {
  if (value === null || value === undefined) return "–";
  return value >= 1000 ? `${(value / 1000).toFixed(1)} s` : `${value} ms`;
}

function rows(tableId, items, render, emptyText) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  if (!items.length) {
    const tr = body.insertRow();
    const td = tr.insertCell();
    td.colSpan = $(tableId).querySelectorAll("th").length;
    td.className = "empty";
    td.textContent = emptyText;
    return;
  }
  for (const item of items) {
    const tr = body.insertRow();
    for (const cell of render(item)) {
      const td = tr.insertCell();
      if (cell && typeof cell === "object") { td.textContent = cell.text; td.className = cell.cls; }
      else td.textContent = cell;
    }
  }
}

function colour(percent) {
  if (percent < 0) return "#d1d5db";
  return `hsl(${120 - 1.2 * percent}, ${60 + 0.15 * percent}%, ${45 + 0.05 * percent}%)`;
}

function drawHeatmap(pool, data) {
  const canvas = $(`heatmap-${pool}`);
  const ctx = canvas.getContext("2d");
  const cells = data.cells;
  canvas.dataset.cells = String(cells.length);
  canvas.dataset.busy = String(cells.filter((c) => c > 0).length);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (!cells.length) return;
  // Square-ish cells filling the canvas width, as many rows as needed.
  const area = canvas.width * canvas.height;
  let side = Math.max(2, Math.floor(Math.sqrt(area / cells.length)));
  let perRow = Math.floor(canvas.width / side);
  while (Math.ceil(cells.length / perRow) * side > canvas.height && side > 2) {
    side -= 1;
    perRow = Math.floor(canvas.width / side);
  }
  const gap = side > 6 ? 1 : 0;
  cells.forEach((value, i) => {
    ctx.fillStyle = colour(value);
    ctx.fillRect((i % perRow) * side, Math.floor(i / perRow) * side, side - gap, side - gap);
  });
  const mean = data.mean_percent === null ? "–" : `${data.mean_percent}%`;
  const grouping = data.nodes_per_cell > 1 ? `, ${data.nodes_per_cell} nodes per cell` : "";
  text(`heatmap-${pool}-caption`, `mean ${mean}, ${data.busy_nodes} nodes in use${grouping}`);
}

function drawSeries(canvasId, points, series, unit) {
  const canvas = $(canvasId);
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, h);
  let max = 0;
  for (const s of series) for (const p of points) max = Math.max(max, p[s.key] || 0);
  max = max || 1;
  ctx.strokeStyle = "#e3e6eb";
  ctx.fillStyle = "#6b7280";
  ctx.font = "11px system-ui, sans-serif";
  ctx.beginPath(); ctx.moveTo(pad, 4); ctx.lineTo(pad, h - 14); ctx.lineTo(w, h - 14); ctx.stroke();
  ctx.fillText(unit === "ms" ? ms(Math.round(max)) : String(max), 0, 12);
  ctx.fillText("0", 0, h - 14);
  ctx.fillText(`-${points.length}s`, pad, h - 2);
  ctx.fillText("now", w - 22, h - 2);
  series.forEach((s, k) => {
    ctx.strokeStyle = s.colour;
    ctx.beginPath();
    let started = false;
    points.forEach((p, i) => {
      const v = p[s.key];
      if (v === null || v === undefined) { started = false; return; }
      const x = pad + (i / Math.max(points.length - 1, 1)) * (w - pad);
      const y = h - 14 - (v / max) * (h - 22);
      if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
    });
    ctx.stroke();
    // Dots as well: a lone second of binds has no line to draw.
    ctx.fillStyle = s.colour;
    points.forEach((p, i) => {
      const v = p[s.key];
      if (v === null || v === undefined || v === 0) return;
      const x = pad + (i / Math.max(points.length - 1, 1)) * (w - pad);
      ctx.fillRect(x - 1.5, h - 14 - (v / max) * (h - 22) - 1.5, 3, 3);
    });
    ctx.fillStyle = s.colour;
    ctx.fillText(s.label, w - 150 + k * 70, 12);
  });
}

function render(s) {
  text("cluster-name", s.cluster);
  text("updated", `updated ${new Date(s.time_ms).toLocaleTimeString()}`);
  text("nodes-total", s.nodes.total);
  text("nodes-ready", s.nodes.ready);
  text("pods-pending", s.pods.pending);
  text("pods-bound", s.pods.bound);
  text("pods-running", s.pods.running);

  const series = s.throughput;
  const points = series.bound.map((bound, i) => ({
    bound, p50_ms: series.p50_ms[i], p99_ms: series.p99_ms[i],
  }));
  const recent = points.slice(-10);
  const perSecond = recent.reduce((n, p) => n + p.bound, 0) / Math.max(recent.length, 1);
  text("throughput-now", perSecond.toFixed(1));
  const lastWith = [...points].reverse().find((p) => p.p50_ms !== null);
  text("latency-now", lastWith ? `${ms(lastWith.p50_ms)} / ${ms(lastWith.p99_ms)}` : "–");
  $("throughput").dataset.total = String(series.bound.reduce((n, b) => n + b, 0));
  const b = s.binder;
  text("binder-leader", b.leader ? `${b.leader} (${b.epoch})` : "none");

  drawHeatmap("guaranteed", s.nodes.pools.guaranteed);
  drawHeatmap("best_effort", s.nodes.pools.best_effort);
  text("window-caption", `last ${Math.round(points.length / 60)} min`);
  drawSeries("throughput", points, [{ key: "bound", label: "bound/s", colour: "#2563eb" }], "");
  drawSeries("latency", points, [
    { key: "p50_ms", label: "p50", colour: "#15803d" },
    { key: "p99_ms", label: "p99", colour: "#b91c1c" },
  ], "ms");

  rows("pending-reasons", s.pending_reasons, (r) => [r.reason, r.pods], "no pending pods");
  rows("gpus", s.gpus, (g) => [g.model, g.nodes, g.cards, `${g.used} / ${g.cards}`], "no GPU nodes");
  const frag = s.gpu_fragmentation;
  text("gpu-fragmentation", s.gpus.length && frag
    ? `fragmentation: expected ${frag.expected_percent} %, whole-machine ${frag.fragmentation_percent} % `
      + `of ${frag.free_gpus} free GPUs; ${frag.whole_free_nodes} whole free GPU nodes`
    : "");
  rows("gangs", s.gangs, (g) => [g.phase, g.jobs], "no gangs");
  rows("queues", s.queues, (q) => [
    q.name,
    q.quota ? `${cpu(q.quota.milli_cpu)} / ${bytes(q.quota.memory_bytes)}` : "unlimited",
    `${cpu(q.used.milli_cpu)} / ${bytes(q.used.memory_bytes)}`,
    q.pending_pods,
    q.pending_units,
  ], "no queues");
  rows("shards", s.shards, (sh) => [
    sh.name, sh.address, sh.ready ? "yes" : "no", `${sh.heartbeat_age_s} s ago`, sh.undecided_pods,
  ], "no scheduler shards");
  const rsv = s.reservations || { count: 0, milli_cpu: 0, memory_bytes: 0, soonest: [] };
  $("reservations-total").textContent = rsv.count
    ? `${rsv.count} holding ${cpu(rsv.milli_cpu)} / ${bytes(rsv.memory_bytes)}`
    : "";
  rows("reservations", rsv.soonest, (r) => [
    r.name, r.node || "(pending)", r.owner, cpu(r.milli_cpu), bytes(r.memory_bytes),
    new Date(r.expires_ms).toLocaleTimeString(),
  ], "no reservations");
  rows("movements", s.movements, (m) => [
    m.name, m.policy, m.batch, m.pods, m.phase,
    new Date(m.created_ms).toLocaleTimeString(), { text: m.message, cls: "msg" },
  ], "no movements yet");
}

function connect() {
  const source = new EventSource("/api/events");
  source.addEventListener("summary", (event) => {
    const status = $("connection");
    status.textContent = "live";
    status.className = "status live";
    render(JSON.parse(event.data));
  });
  source.onerror = () => {
    const status = $("connection");
    status.textContent = "reconnecting…";
    status.className = "status off";
  };
}

connect();
