// The latency dashboard: stored turns and TTFS percentiles from the HTTP API, then live
// updates from /api/dashboard/stream (server-sent events). Plain DOM and SVG, no build step.
"use strict";

const STAGES = ["asr_final", "retrieval", "llm_first_token", "first_sentence", "tts_first_audio", "first_audio_sent"];
const STAGE_LABELS = {
  asr_final: "transcript", retrieval: "passages retrieved", llm_first_token: "LLM first token", first_sentence: "first phrase to TTS",
  tts_first_audio: "TTS first audio", first_audio_sent: "audio sent (TTFS)",
};
const MAX_ROWS = 100;              // turns kept in the waterfall
const SUMMARY_REFRESH_MS = 30000;  // buckets slide with time even when nobody calls
const SUMMARY_DEBOUNCE_MS = 1500;  // a burst of turns refreshes the percentiles once
const STALE_AFTER_MS = 5000;       // the server sends status every second; silence this long means trouble
const NICE_MS = [500, 1000, 1500, 2000, 3000, 4000, 5000, 7500, 10000, 15000, 20000, 30000, 60000];

const $ = (id) => document.getElementById(id);
const state = {
  agent: "", transport: "", windowS: 3600,
  turns: new Map(),      // "call_id:index" -> turn
  fresh: new Set(),      // keys that arrived live, highlighted once
  summary: null,         // the last summary, redrawn on resize
  dropped: 0, lastStatusAt: 0, summaryTimer: null, stream: null,
};

// ---------- formatting ----------
function ms(value) { return value == null ? "—" : `${Math.round(value)}`; }
function clock(epochS, { seconds = true, date = false } = {}) {
  const d = new Date(epochS * 1000);
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: seconds ? "2-digit" : undefined, hour12: false });
  return date ? `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${time}` : time;
}
function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return s % 60 ? `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s` : `${s / 60} min`;
  return s % 3600 ? `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m` : `${s / 3600} h`;
}
function niceCeil(value) { return NICE_MS.find((n) => n >= value) || Math.ceil(value / 60000) * 60000; }
// The smallest round step that splits 0..scale into at most `most` parts and ends on `scale`.
function niceStep(scale, most) {
  return [100, 200, 250, 500, 1000, 2500, 5000, 10000, 15000, 30000].find((s) => scale % s === 0 && scale / s <= most) || scale / 2;
}
function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text != null) node.textContent = text;   // server strings are text, never HTML
  return node;
}
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text != null) node.textContent = text;
  return node;
}
function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) q.set(k, v);
  return q.toString();
}
function matchesFilter(turn) {
  return (!state.agent || turn.agent === state.agent) && (!state.transport || turn.transport === state.transport);
}

// ---------- data ----------
async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${url}: ${response.status}`);
  return body;
}

async function loadTurns() {
  const since = Math.floor(Date.now() / 1000 - state.windowS);
  const body = await getJSON(`/api/turns?${query({ limit: MAX_ROWS, since, agent: state.agent, transport: state.transport })}`);
  state.turns = new Map(body.turns.map((t) => [`${t.call_id}:${t.index}`, t]));
  renderWaterfall();
}

async function loadSummary() {
  clearTimeout(state.summaryTimer);
  state.summaryTimer = setTimeout(loadSummary, SUMMARY_REFRESH_MS);
  try {
    const body = await getJSON(`/api/dashboard/summary?${query({ window_s: state.windowS, agent: state.agent, transport: state.transport })}`);
    renderSummary(body);
  } catch (error) { setLive("error", `summary: ${error.message}`); }
}

function scheduleSummary() {
  clearTimeout(state.summaryTimer);
  state.summaryTimer = setTimeout(loadSummary, SUMMARY_DEBOUNCE_MS);
}

function addTurn(turn) {
  if (!matchesFilter(turn)) return;
  const key = `${turn.call_id}:${turn.index}`;
  state.turns.set(key, turn);
  state.fresh.add(key);
  const newestFirst = [...state.turns.values()].sort((a, b) => (b.end_of_speech_at || 0) - (a.end_of_speech_at || 0));
  state.turns = new Map(newestFirst.slice(0, MAX_ROWS).map((t) => [`${t.call_id}:${t.index}`, t]));
  renderWaterfall();
  scheduleSummary();
}

// ---------- live stream ----------
function setLive(kind, text) { const live = $("live"); live.dataset.state = kind; live.textContent = text; }

function connectStream() {
  if (state.stream) state.stream.close();
  const stream = new EventSource("/api/dashboard/stream");
  state.stream = stream;
  let hadError = false;
  stream.addEventListener("open", () => {
    // After a reconnect, turns that closed while we were away are only in the store.
    if (hadError) { hadError = false; loadTurns().catch(() => {}); loadSummary(); }
  });
  stream.addEventListener("turn", (event) => addTurn(JSON.parse(event.data)));
  stream.addEventListener("status", (event) => {
    const status = JSON.parse(event.data);
    state.lastStatusAt = Date.now();
    setLive("live", `live · ${status.streams} watching`);
    renderNow(status);
    if (status.dropped > state.dropped) {   // this tab fell behind and lost events: re-read them
      state.dropped = status.dropped;
      loadTurns().catch(() => {});
    }
  });
  stream.addEventListener("end", () => setLive("reconnecting", "server stopped; reconnecting…"));
  stream.addEventListener("error", () => {
    hadError = true;
    if ($("live").dataset.state !== "reconnecting") setLive("reconnecting", "reconnecting…");
  });
}

setInterval(() => {
  if (state.lastStatusAt && Date.now() - state.lastStatusAt > STALE_AFTER_MS && $("live").dataset.state === "live") {
    setLive("stale", "no updates — stream stalled");
  }
}, 1000);

// ---------- rendering: now ----------
function renderNow(status) {
  $("calls-count").textContent = status.calls.length;
  const calls = status.calls.map((call) => {
    const row = el("tr", { "data-call-id": call.id });
    row.append(el("td", { class: "mono", title: call.id }, call.id.slice(0, 8)), el("td", {}, call.agent),
      el("td", {}, call.transport), el("td", {}, duration(status.at - call.started_at)), el("td", {}, call.turns));
    return row;
  });
  if (!calls.length) calls.push(emptyRow(5, "no calls right now"));
  $("calls").tBodies[0].replaceChildren(...calls);
  $("engines").tBodies[0].replaceChildren(...status.engines.map((engine) => {
    const row = el("tr", { "data-engine": engine.name });
    const depth = engine.queue_depth == null ? "—" : engine.queue_depth;
    row.append(el("td", {}, engine.name), el("td", { class: engine.queue_depth > 1 ? "warn" : "" }, depth),
      el("td", { title: engine.batch_size == null ? "this engine does not batch" : "" },
        engine.batch_size == null ? "—" : engine.batch_size));
    return row;
  }));
}

function emptyRow(columns, text) {
  const row = el("tr", { class: "empty" });
  row.append(el("td", { colspan: columns }, text));
  return row;
}

// ---------- rendering: summary ----------
function renderSummary(body) {
  state.summary = body;
  for (const stat of ["p50", "p95", "p99"]) {
    const value = body.overall[stat];
    document.querySelector(`#ttfs-overall [data-stat="${stat}"]`).textContent = value == null ? "—" : `${ms(value)} ms`;
  }
  document.querySelector('#ttfs-overall [data-stat="count"]').textContent = body.overall.count;
  $("bucket-note").textContent = `ms · ${duration(body.bucket_s)} buckets${body.truncated ? " · newest turns only" : ""}`;
  renderChart(body);
  renderGroups(body.groups);
  fillFilterChoices(body.groups);
}

function renderGroups(groups) {
  const rows = groups.map((g) => {
    const row = el("tr", { "data-agent": g.agent, "data-transport": g.transport });
    const selected = (!state.agent || state.agent === g.agent) && (!state.transport || state.transport === g.transport);
    if (!selected) row.classList.add("dim");
    row.append(el("td", {}, g.agent), el("td", {}, g.transport), el("td", {}, g.count),
      el("td", {}, ms(g.p50)), el("td", {}, ms(g.p95)), el("td", {}, ms(g.p99)));
    return row;
  });
  if (!rows.length) rows.push(emptyRow(6, "no turns in this window"));
  $("groups").tBodies[0].replaceChildren(...rows);
}

function fillFilterChoices(groups) {
  for (const [id, key] of [["agent", "agent"], ["transport", "transport"]]) {
    const select = $(id);
    const names = new Set(groups.map((g) => g[key]));
    if (state[key]) names.add(state[key]);
    const have = new Set([...select.options].map((o) => o.value));
    for (const name of [...names].sort()) if (!have.has(name)) select.append(el("option", { value: name }, name));
    select.value = state[key];
  }
}

function renderChart(body) {
  const chart = $("ttfs-chart");
  const width = Math.max(320, chart.clientWidth || 600), height = 220;
  const pad = { left: 52, right: 12, top: 10, bottom: 26 };
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const nodes = [];
  const withData = body.buckets.filter((b) => b.count > 0);
  const top = niceCeil(Math.max(1000, ...withData.map((b) => b.p99)));
  const x = (t) => pad.left + ((t - body.start) / (body.end - body.start)) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / top) * (height - pad.top - pad.bottom);
  for (let v = 0; v <= top; v += niceStep(top, 5)) {   // horizontal grid with ms labels
    nodes.push(svg("line", { x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), class: "grid" }));
    nodes.push(svg("text", { x: pad.left - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, `${Math.round(v)}`));
  }
  const withDate = body.window_s > 86400;
  for (const t of timeTicks(body.start, body.end)) {   // time labels on round minutes or hours
    nodes.push(svg("line", { x1: x(t), x2: x(t), y1: height - pad.bottom, y2: height - pad.bottom + 4, class: "grid" }));
    nodes.push(svg("text", { x: x(t), y: height - 8, class: "axis", "text-anchor": "middle" }, clock(t, { seconds: false, date: withDate })));
  }
  for (const stat of ["p99", "p95", "p50"]) {
    let path = "", pen = false;
    for (const b of body.buckets) {
      const mid = b.start + body.bucket_s / 2;
      if (b.count === 0) { pen = false; continue; }   // a gap where nobody spoke
      path += `${pen ? "L" : "M"}${x(Math.min(mid, body.end)).toFixed(1)},${y(b[stat]).toFixed(1)}`;
      pen = true;
    }
    if (path) nodes.push(svg("path", { d: path, class: `line ${stat}` }));
    for (const b of withData) {
      const dot = svg("circle", { cx: x(Math.min(b.start + body.bucket_s / 2, body.end)), cy: y(b[stat]), r: 2.6, class: `dot ${stat}` });
      dot.append(svg("title", {}, `${clock(b.start, { seconds: false, date: withDate })} · ${stat} ${ms(b[stat])} ms · ${b.count} turns`));
      nodes.push(dot);
    }
  }
  if (!withData.length) {
    nodes.push(svg("text", { x: width / 2, y: height / 2, class: "axis empty", "text-anchor": "middle" }, "no turns in this window yet"));
  }
  chart.replaceChildren(...nodes);
}

const TICK_STEPS_S = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
function timeTicks(start, end) {
  const step = TICK_STEPS_S.find((s) => (end - start) / s <= 6) || 86400;
  const ticks = [];
  for (let t = Math.ceil(start / step) * step; t <= end; t += step) ticks.push(t);
  return ticks;
}

// ---------- rendering: waterfall ----------
function renderLegend() {
  $("stage-legend").replaceChildren(...STAGES.map((stage) => {
    const item = el("span", { class: "legend-item" });
    item.append(el("span", { class: `key stage-${stage}` }), document.createTextNode(STAGE_LABELS[stage]));
    return item;
  }));
}

function renderWaterfall() {
  const turns = [...state.turns.values()];
  const longest = Math.max(1000, ...turns.flatMap((t) => Object.values(t.stage_ms || {})));
  const scale = niceCeil(longest);
  const header = el("div", { class: "wf-row wf-head", role: "row" });
  header.append(el("span", { role: "columnheader" }, "time"), el("span", { role: "columnheader" }, "call · turn"),
    axis(scale), el("span", { role: "columnheader", class: "num" }, "TTFS ms"));
  const rows = turns.map((turn) => waterfallRow(turn, scale));
  if (!rows.length) rows.push(el("div", { class: "wf-empty" }, "No turns yet. Make a call from the call page."));
  $("waterfall").replaceChildren(header, ...rows);
  state.fresh.clear();
}

function axis(scale) {
  const cell = el("span", { class: "wf-axis", role: "columnheader" });
  const step = niceStep(scale, 5);
  for (let v = 0; v <= scale; v += step) {
    const tick = el("span", { class: "tick", style: `left:${(v / scale) * 100}%` }, v);
    cell.append(tick);
  }
  return cell;
}

function waterfallRow(turn, scale) {
  const key = `${turn.call_id}:${turn.index}`;
  const row = el("div", {
    class: `wf-row${state.fresh.has(key) ? " fresh" : ""}`, role: "row",
    "data-call-id": turn.call_id, "data-turn-index": turn.index,
    "data-ttfs-ms": turn.ttfs_ms == null ? "" : turn.ttfs_ms,
  });
  const who = el("span", { class: "who", title: `${turn.call_id} · ${turn.agent} · ${turn.transport}` });
  who.append(el("span", { class: "mono" }, turn.call_id.slice(0, 8)), document.createTextNode(` #${turn.index} `),
    el("span", { class: "tag" }, turn.transport));
  if (turn.interrupted) who.append(el("span", { class: "tag interrupted" }, "barge-in"));
  const bar = el("span", { class: "wf-bar", role: "cell" });
  let previous = 0;
  const described = [];
  for (const stage of STAGES) {
    const at = turn.stage_ms ? turn.stage_ms[stage] : undefined;
    if (at == null) continue;
    const from = Math.max(0, Math.min(previous, at));
    const seg = el("span", {
      class: `seg stage-${stage}`, "data-stage": stage,
      style: `left:${(from / scale) * 100}%;width:${Math.max(0.4, ((at - from) / scale) * 100)}%`,
      title: `${STAGE_LABELS[stage]}: +${ms(at)} ms`,
    });
    bar.append(seg);
    described.push(`${STAGE_LABELS[stage]} +${ms(at)}`);
    previous = Math.max(previous, at);
  }
  row.title = described.join(" · ");
  const spokeAt = turn.end_of_speech_at;
  const olderThanADay = spokeAt && Date.now() / 1000 - spokeAt > 86400;
  row.append(el("span", { class: "time", role: "cell" }, spokeAt ? clock(spokeAt, { date: olderThanADay }) : "—"),
    who, bar, el("span", { class: "num ttfs-value", role: "cell" }, ms(turn.ttfs_ms)));
  return row;
}

// ---------- filters ----------
function readFiltersFromUrl() {
  const params = new URLSearchParams(location.search);
  state.agent = params.get("agent") || "";
  state.transport = params.get("transport") || "";
  const windowS = Number(params.get("window_s"));
  if ([...$("window").options].some((o) => Number(o.value) === windowS)) state.windowS = windowS;
  $("window").value = String(state.windowS);
}

function onFilterChange() {
  state.agent = $("agent").value;
  state.transport = $("transport").value;
  state.windowS = Number($("window").value);
  history.replaceState(null, "", `?${query({ agent: state.agent, transport: state.transport, window_s: state.windowS })}`);
  loadTurns().catch((error) => setLive("error", `turns: ${error.message}`));
  loadSummary();
}

readFiltersFromUrl();
fillFilterChoices([]);
renderLegend();
renderWaterfall();
$("filters").addEventListener("change", onFilterChange);
window.addEventListener("resize", () => { if (state.summary) renderChart(state.summary); });
loadTurns().catch((error) => setLive("error", `turns: ${error.message}`));
loadSummary();
connectStream();
