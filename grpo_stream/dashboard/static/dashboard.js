// grpo-stream dashboard: one EventSource; a `snapshot` replaces the state, each `update`
// adds to it; every text from the run (completions, alarms) goes in as text, never as HTML.
"use strict";

const MAX_COMPLETIONS = 50;
const SHOWN_COMPLETIONS = 20;
const STALENESS_WINDOW = 100; // metrics rows summed into the staleness histogram
const RATE_WINDOW = 5; // metrics rows one steps/s point is measured over

const state = { info: {}, run: {}, graph: { nodes: [], queues: {} }, metrics: [],
  completions: [], evals: [], alarms: new Map() };

// ----- small DOM helpers -------------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";
function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}
const $ = (id) => document.getElementById(id);
const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return v.toLocaleString();
  return Math.abs(v) >= 100 ? Math.round(v).toLocaleString() : v.toPrecision(digits);
}

// ----- the stream --------------------------------------------------------------------
const ENDED = new Set(["completed", "interrupted", "failed", "dead"]); // the run is over

function connect() {
  const source = new EventSource("/api/events");
  source.addEventListener("open", () => { $("connection").textContent = "connected"; });
  source.addEventListener("error", () => {
    if (ENDED.has(state.run.phase)) { // the server said how the run ended, then went away
      source.close();
      $("connection").textContent = "finished: this page no longer updates";
      return;
    }
    state.run = { ...state.run, phase: "disconnected" }; // never "live" without a server
    renderHeader();
    $("connection").textContent = "disconnected: retrying";
  });
  source.addEventListener("snapshot", (e) => { takeSnapshot(JSON.parse(e.data)); render(); });
  source.addEventListener("update", (e) => { takeUpdate(JSON.parse(e.data)); render(); });
}

function takeSnapshot(snap) {
  state.info = snap.info || {};
  state.run = snap.run || {};
  state.graph = snap.graph || { nodes: [], queues: {} };
  const files = snap.files || { metrics: [], completions: [], evals: [], alarms: [] };
  state.metrics = files.metrics;
  state.completions = files.completions;
  state.evals = files.evals;
  state.alarms = new Map();
  for (const a of files.alarms) state.alarms.set(a.instance + "|" + a.event, a);
}

function takeUpdate(up) {
  state.run = up.run;
  state.graph = up.graph;
  if (!up.files) return;
  state.metrics.push(...up.files.metrics);
  state.completions.push(...up.files.completions);
  state.completions.splice(0, Math.max(0, state.completions.length - MAX_COMPLETIONS));
  state.evals.push(...up.files.evals);
  for (const a of up.files.alarms) state.alarms.set(a.instance + "|" + a.event, a);
}

// ----- rendering ---------------------------------------------------------------------
function render() {
  renderHeader();
  renderGraph();
  renderQueues();
  renderAlarms();
  renderCharts();
  renderEvals();
  renderCompletions();
}

function renderHeader() {
  const info = state.info, run = state.run;
  $("run-name").textContent = info.name || "";
  const phase = $("phase");
  phase.textContent = run.phase || "waiting";
  phase.className = "badge phase-" + (run.phase || "waiting");
  phase.dataset.phase = run.phase || "waiting";
  const last = state.metrics.length ? state.metrics[state.metrics.length - 1] : null;
  const steps = last ? last.step : 0;
  $("step").textContent = "step " + fmt(steps) + (info.max_steps ? " / " + fmt(info.max_steps) : "");
  $("step").dataset.step = steps;
  const version = run.policy_version ?? (last ? last.policy_version : null);
  $("version").textContent = version === null || version === undefined ? "" : "policy v" + version;
  const facts = [info.model, info.task,
    info.groups_per_step ? info.groups_per_step + " groups × " + info.group_size : null,
    info.max_staleness !== null && info.max_staleness !== undefined
      ? "max staleness " + info.max_staleness : null, run.hub].filter(Boolean);
  $("run-facts").textContent = facts.join(" · ");
  const reason = $("reason");
  reason.hidden = !run.reason;
  reason.textContent = run.reason || "";
}

function renderGraph() {
  const svg = $("graph");
  svg.replaceChildren(arrowMarker());
  const nodes = state.graph.nodes;
  const byService = (s) => nodes.filter((n) => n.service === s);
  const hub = byService("grouper")[0];
  const place = new Map();
  const W = 180;
  const column = (list, x, top, bottom) => {
    const slot = (bottom - top) / Math.max(list.length, 1);
    const h = Math.min(66, slot - 8);
    list.forEach((n, i) => place.set(n.instance, { x, y: top + i * slot + (slot - h) / 2, w: W, h }));
  };
  column(byService("trainer"), 10, 60, 270);
  if (hub) place.set(hub.instance, { x: 350, y: 132, w: W, h: 66 });
  const right = [...byService("generator"), ...byService("scorer")];
  column(right, 700, 0, 330);
  column(byService("evaluator"), 350, 250, 330);
  const queues = state.graph.queues || {};
  for (const n of nodes) {
    if (!hub || n === hub || !place.has(n.instance)) continue;
    const ready = queues.buffer !== undefined ? " · " + fmt(queues.buffer) + " ready" : "";
    const label = n.service === "trainer" ? "batches" + ready
      : n.credits !== null && n.credits !== undefined ? "credits " + n.credits : "";
    svg.append(edge(place.get(hub.instance), place.get(n.instance), label));
  }
  for (const n of nodes) if (place.has(n.instance)) svg.append(nodeBox(n, place.get(n.instance)));
}

function arrowMarker() {
  const marker = el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5",
    markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" },
  el("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#9aa3b5" }));
  return el("svg:defs", {}, marker);
}

function edge(a, b, label) {
  const ax = a.x + (b.x > a.x ? a.w : 0), bx = b.x + (b.x > a.x ? 0 : b.w);
  const ay = a.y + a.h / 2, by = b.y + b.h / 2;
  const g = el("svg:g", { class: "edge-group" });
  g.append(el("svg:path", { class: "edge", d: `M ${ax} ${ay} L ${bx} ${by}` }));
  if (label) {
    g.append(el("svg:text", { class: "edge-label", x: (ax + bx) / 2, y: (ay + by) / 2 - 4,
      "text-anchor": "middle" }, label));
  }
  return g;
}

function nodeBox(n, p) {
  const g = el("svg:g", { class: "node state-" + n.state, "data-service": n.service,
    "data-instance": n.instance, "data-state": n.state, transform: `translate(${p.x},${p.y})` });
  g.append(el("svg:rect", { width: p.w, height: p.h }));
  const device = [n.device, n.devices && n.devices !== n.device ? n.devices : null]
    .filter(Boolean).join(" · ");
  const speed = n.throughput !== null && n.throughput !== undefined
    ? fmt(n.throughput) + " " + n.unit : "";
  const version = n.version !== null && n.version !== undefined ? "v" + n.version : "";
  const third = [version, n.state === "running" ? speed : n.state].filter(Boolean).join(" · ");
  const lines = [[n.instance, "name"], [device || n.host || "", "line"], [third, "line"]];
  const step = p.h / (lines.length + 0.6);
  lines.forEach(([text, cls], i) => {
    if (text) g.append(el("svg:text", { class: cls, x: 8, y: step * (i + 1) }, text));
  });
  g.append(el("svg:title", {}, `${n.service} ${n.instance} (${n.state})`));
  return g;
}

function renderQueues() {
  const q = state.graph.queues || {};
  const rows = [
    ["groups at generators and scorers", q.in_progress],
    ["waiting for a scorer", q.to_score],
    ["waiting to be re-dispatched", q.retry],
    ["ready for the trainer (buffer)", q.buffer],
    ["dispatched", q.dispatched],
    ["trained", q.trained],
  ];
  for (const service of ["generator", "scorer"]) {
    const credits = state.graph.nodes.filter((n) => n.service === service && n.credits !== null)
      .reduce((s, n) => s + n.credits, 0);
    rows.push([service + " credits (asked for)", credits]);
  }
  $("queues").replaceChildren(...rows.filter(([, v]) => v !== undefined)
    .map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, fmt(v ?? null)))));
}

function renderAlarms() {
  const items = [];
  for (const p of state.run.problems || []) {
    items.push(el("li", { class: "alarm", "data-kind": "problem" },
      el("span", { class: "kind kind-problem" }, "now"), p));
  }
  const alarms = [...state.alarms.values()].sort((a, b) => b.last_t - a.last_t);
  for (const a of alarms) {
    const when = new Date(a.last_t * 1000).toLocaleTimeString();
    const count = a.count > 1 ? ` ×${a.count}` : "";
    items.push(el("li", { class: "alarm", "data-kind": a.kind, title: a.text },
      el("span", { class: "kind kind-" + a.kind }, a.kind),
      el("b", {}, `${a.event}${count}`), ` ${a.instance} ${when}: `, a.text));
  }
  $("alarm-count").textContent = items.length ? `(${items.length})` : "";
  $("alarms").replaceChildren(...(items.length ? items : [el("li", { class: "dim" }, "none")]));
}

// ----- charts ------------------------------------------------------------------------
function series(key) {
  const x = [], y = [];
  for (const r of state.metrics) {
    const v = num(r[key]);
    if (v !== null) { x.push(r.step); y.push(v); }
  }
  return { x, y };
}

function line(key, name, extra = {}) {
  return { ...series(key), name: name || key, type: "scatter", mode: "lines", ...extra };
}

function scaled(key, factor, name) {
  const s = series(key);
  return { x: s.x, y: s.y.map((v) => v * factor), name, type: "scatter", mode: "lines" };
}

function stepsPerSecond() {
  const rows = state.metrics.filter((r) => num(r.wall_time) !== null);
  const x = [], y = [];
  for (let i = RATE_WINDOW; i < rows.length; i++) {
    const a = rows[i - RATE_WINDOW], b = rows[i];
    const dt = b.wall_time - a.wall_time;
    if (dt > 0) { x.push(b.step); y.push((b.step - a.step) / dt); }
  }
  return { x, y };
}

function evalSeries(key) {
  const rows = state.evals.filter((r) => num(r[key]) !== null);
  return { x: rows.map((r) => r.step), y: rows.map((r) => r[key]) };
}

function stalenessBars() {
  const counts = [];
  let rows = 0;
  for (const r of state.metrics.slice(-STALENESS_WINDOW)) {
    if (!Array.isArray(r.staleness_counts)) continue;
    rows += 1;
    r.staleness_counts.forEach((c, i) => { counts[i] = (counts[i] || 0) + c; });
  }
  if (rows) {
    const x = counts.map((_, i) => i), y = counts.map((c) => c || 0);
    return { trace: { x, y, type: "bar", name: "sequences" },
      title: `staleness: sequences by versions behind (last ${rows} steps)` };
  }
  return { trace: { x: series("staleness_mean").y, type: "histogram", name: "steps" },
    title: "staleness: steps by mean versions behind" };
}

function versionBars() {
  const gens = state.graph.nodes.filter((n) => n.service === "generator" && n.version !== null);
  const trainer = state.graph.nodes.find((n) => n.service === "trainer");
  const x = gens.map((n) => n.instance), y = gens.map((n) => n.version);
  const traces = [{ x, y, type: "bar", name: "generator weights" }];
  const tv = trainer && trainer.version !== null ? trainer.version : state.run.policy_version;
  if (tv !== null && tv !== undefined && x.length) {
    traces.push({ x, y: x.map(() => tv), type: "scatter", mode: "lines+markers",
      name: "trainer", line: { dash: "dot" } });
  }
  return traces;
}

const LAYOUT = { margin: { l: 48, r: 40, t: 30, b: 36 }, height: 240,
  legend: { orientation: "h", y: -0.22, font: { size: 10 } }, font: { size: 11 },
  xaxis: { title: { text: "step", standoff: 4 } } };

function chart(id, title, traces, extra = {}) {
  const div = $(id);
  const points = traces.length ? (traces[0].x || []).length : 0;
  div.dataset.points = points;
  if (typeof Plotly === "undefined") {
    div.textContent = `${title}: ${points} points (plotly.js is not available)`;
    return;
  }
  const layout = { ...LAYOUT, ...extra,
    title: { text: title, font: { size: 13 }, x: 0.01, xanchor: "left" } };
  Plotly.react(div, traces, layout, { displayModeBar: false, responsive: true });
}

function renderCharts() {
  chart("chart-reward", "reward", [
    line("reward_mean", "reward mean", { opacity: 0.8 }),
    line("pass_rate", "pass rate"),
    { ...evalSeries("eval/pass@1"), name: "held-out pass@1", mode: "lines+markers",
      type: "scatter", line: { dash: "dash" } },
  ]);
  chart("chart-kl", "KL to the reference", [line("kl", "kl")]);
  chart("chart-grad", "grad norm and tau", [
    line("grad_norm", "before"), line("grad_norm_after", "after"),
    line("tau", "tau", { line: { dash: "dot" } })]);
  chart("chart-clip", "clip fraction", [line("clip_frac", "clip fraction")]);
  chart("chart-throughput", "throughput", [
    line("tokens_per_s", "completion tokens/s"),
    { ...stepsPerSecond(), name: "trainer steps/s", type: "scatter", mode: "lines",
      yaxis: "y2" }], { yaxis2: { overlaying: "y", side: "right", showgrid: false } });
  chart("chart-reward-cost", "reward cost: scorer CPU ms per completion", [
    scaled("scorer_cpu_s_per_completion", 1000, "scorer CPU ms / completion")]);
  const stale = stalenessBars();
  chart("chart-staleness", stale.title, [stale.trace],
    { xaxis: { title: { text: "versions behind", standoff: 4 }, dtick: 1 } });
  chart("chart-versions", "weights version per generator", versionBars(),
    { xaxis: { title: { text: "", standoff: 4 } } });
}

// ----- tables ------------------------------------------------------------------------
function renderEvals() {
  if (!state.evals.length) return;
  const head = el("tr", {}, ...["step", "version", "pass@1", "pass@k", "reward", "problems"]
    .map((h) => el("th", {}, h)));
  const rows = state.evals.slice(-10).reverse().map((r) => el("tr", {},
    el("td", {}, fmt(r.step)), el("td", {}, fmt(r.policy_version)),
    el("td", {}, fmt(r["eval/pass@1"])), el("td", {}, fmt(r["eval/pass@k"]) + ` (k=${r["eval/k"]})`),
    el("td", {}, fmt(r["eval/reward"])), el("td", {}, fmt(r["eval/problems"]))));
  $("evals").replaceChildren(head, ...rows);
}

function renderCompletions() {
  if (!state.completions.length) return;
  const head = el("tr", {}, ...["step", "weights", "reward", "advantage", "tokens", "prompt",
    "completion"].map((h) => el("th", {}, h)));
  const rows = state.completions.slice(-SHOWN_COMPLETIONS).reverse().map((c) => el("tr",
    { class: "completion" }, el("td", {}, fmt(c.step)),
    el("td", {}, c.version === undefined ? "–" : "v" + c.version), el("td", {}, fmt(c.reward)),
    el("td", {}, fmt(c.advantage)), el("td", {}, fmt(c.tokens)),
    el("td", {}, el("pre", {}, c.prompt ?? "")), el("td", {}, el("pre", {}, c.completion ?? ""))));
  $("completions").replaceChildren(head, ...rows);
}

connect();
