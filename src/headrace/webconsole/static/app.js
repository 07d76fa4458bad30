// headrace console: one page, four views (overview, topics, groups, messages), routed by
// the URL's hash (#topics/NAME, #groups/NAME, #messages?topic=T&partition=P&offset=N).
// Every view refreshes from the JSON API each sampling interval. Data from the cluster is
// put into the page with textContent only (never as HTML).
"use strict";

// Trace colours, set explicitly (the browser test looks for them in screenshots).
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
                 "#17becf", "#bcbd22", "#7f7f7f", "#393b79"];
const LAG_COLOUR = "#d62728";
const PLOT_CONFIG = { displayModeBar: false, responsive: true };

const state = { intervalMs: 2000, view: null, arg: null, busy: false, again: false, topics: [] };

// ------------------------------------------------------------------ helpers

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function td(col, value, cls) {
  return el("td", { dataset: { col }, class: cls }, value === null || value === undefined ? "-" : value);
}

function fillBody(table, rows) {
  const body = $(table).tBodies[0];
  body.replaceChildren(...rows);
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
}

function timeText(ms) {
  if (ms === null || ms === undefined) return "-";
  const d = new Date(ms);
  const pad = (x, n = 2) => String(x).padStart(n, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
         `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

async function api(path, options) {
  const resp = await fetch(path, options);
  let doc = null;
  try { doc = await resp.json(); } catch (e) { doc = null; }
  if (!resp.ok) {
    const err = new Error((doc && doc.error) || `${resp.status} ${resp.statusText}`);
    err.status = resp.status;
    throw err;
  }
  return doc;
}

function banner(text) {
  const b = $("banner");
  b.hidden = !text;
  b.textContent = text || "";
}

function showStatus(doc) {
  if (doc && doc.sampled_at_ms) $("sampled-at").textContent = `sampled ${timeText(doc.sampled_at_ms)}`;
  if (doc && doc.error) {
    banner(`The cluster does not answer: ${doc.error} (showing the last sample)`);
  } else if (doc && doc.stale) {
    const age = Math.round((Date.now() - doc.sampled_at_ms) / 1000);
    banner(`Counts are ${age} s old: the cluster answers slowly (showing the last sample)`);
  } else {
    banner("");
  }
}

// ------------------------------------------------------------------ charts

function timeLayout(yTitle) {
  return {
    margin: { l: 60, r: 20, t: 10, b: 40 },
    xaxis: { type: "date", title: { text: "" } },
    yaxis: { title: { text: yTitle }, rangemode: "tozero" },
    showlegend: true,
    legend: { orientation: "h", y: -0.2 },
    paper_bgcolor: "#ffffff",
    plot_bgcolor: "#ffffff",
    annotations: [],
  };
}

function emptyNote(layout, text) {
  layout.annotations.push({ text, xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
                            font: { color: "#888" } });
  layout.xaxis.visible = false;
  layout.yaxis.visible = false;
}

function drawThroughput(doc) {
  const names = Object.keys(doc.topics).sort();
  const traces = [];
  names.forEach((name, i) => {
    const s = doc.topics[name];
    if (!s.v.some((v) => v > 0)) return; // idle topics stay off the chart
    traces.push({
      name, type: "scatter", mode: "lines",
      x: s.t.map((t) => new Date(t)), y: s.v,
      line: { color: PALETTE[i % PALETTE.length], width: 3 },
    });
  });
  const layout = timeLayout("records/s");
  if (traces.length === 0) emptyNote(layout, "no records appended while the console ran");
  Plotly.react("throughput-chart", traces, layout, PLOT_CONFIG);
}

function drawLag(group, series) {
  const layout = timeLayout("records behind");
  layout.showlegend = false;
  if (series.t.length === 0) emptyNote(layout, "no samples yet");
  Plotly.react("lag-chart", [{
    name: group, type: "scatter", mode: "lines+markers",
    x: series.t.map((t) => new Date(t)), y: series.v,
    line: { color: LAG_COLOUR, width: 3 }, marker: { color: LAG_COLOUR, size: 5 },
  }], layout, PLOT_CONFIG);
}

// ------------------------------------------------------------------ overview

async function refreshOverview() {
  const [cluster, topics, groups, series] = await Promise.all([
    api("/api/cluster"), api("/api/topics"), api("/api/groups"), api("/api/series/throughput")]);
  showStatus(cluster);
  $("cluster-id").textContent = cluster.cluster_id || "-";
  $("controller-id").textContent = cluster.controller_id ?? "-";
  $("broker-count").textContent = (cluster.brokers || []).length;
  $("topic-count").textContent = topics.topics.filter((t) => !t.internal).length;
  const sum = (key) => topics.topics.reduce((n, t) => n + t[key], 0);
  $("under-replicated-count").textContent = sum("under_replicated");
  $("offline-count").textContent = sum("offline");
  $("under-replicated-count").classList.toggle("warn", sum("under_replicated") > 0);
  $("offline-count").classList.toggle("error", sum("offline") > 0);
  $("group-count").textContent = groups.groups.length;
  fillBody("brokers-table", (cluster.brokers || []).map((b) =>
    el("tr", { dataset: { brokerId: b.id }, "data-testid": "broker-row" },
       td("id", b.id), td("host", b.host), td("port", b.port),
       td("role", b.controller ? "controller" : "broker"))));
  drawThroughput(series);
}

// ------------------------------------------------------------------ topics

async function refreshTopics() {
  const doc = await api("/api/topics");
  showStatus(doc);
  state.topics = doc.topics;
  const showInternal = $("show-internal").checked;
  fillBody("topics-table", doc.topics.filter((t) => showInternal || !t.internal).map((t) =>
    el("tr", { dataset: { topic: t.name }, class: state.arg === t.name ? "selected" : null },
       el("td", { dataset: { col: "name" } },
          el("a", { href: `#topics/${encodeURIComponent(t.name)}` }, t.name)),
       td("partitions", t.partitions, "num"), td("replication_factor", t.replication_factor, "num"),
       td("under_replicated", t.under_replicated, t.under_replicated ? "num warn" : "num"),
       td("records", t.records, "num"),
       td("records_per_s", t.records_per_s === null ? null : Math.round(t.records_per_s), "num"),
       td("size", bytes(t.size_bytes), "num"))));
  const detail = $("topic-detail");
  detail.hidden = !state.arg;
  if (state.arg) await refreshTopicDetail(state.arg);
}

async function refreshTopicDetail(name) {
  $("topic-detail-name").textContent = name;
  let doc;
  try {
    doc = await api(`/api/topics/${encodeURIComponent(name)}`);
  } catch (e) {
    $("topic-detail-configs").textContent = e.message;
    fillBody("partitions-table", []);
    return;
  }
  const configs = Object.entries(doc.configs).map(([k, v]) => `${k}=${v}`).join(", ");
  $("topic-detail-configs").textContent = configs ? `Configs: ${configs}` : "No config overrides.";
  fillBody("partitions-table", doc.partitions.map((p) =>
    el("tr", { dataset: { partition: p.partition },
               class: p.isr.length < p.replicas.length ? "warn" : null },
       td("partition", p.partition, "num"), td("leader", p.leader, "num"),
       td("replicas", p.replicas.join(",")), td("isr", p.isr.join(",")),
       td("log_start_offset", p.log_start_offset, "num"),
       td("high_watermark", p.high_watermark, "num"), td("records", p.records, "num"),
       td("size", bytes(p.size_bytes), "num"),
       el("td", {}, el("a", {
         href: `#messages?topic=${encodeURIComponent(name)}&partition=${p.partition}` +
               `&offset=${p.log_start_offset}` }, "messages")))));
}

function parseConfigs(text) {
  const out = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line) continue;
    const i = line.indexOf("=");
    if (i <= 0) throw new Error(`configs: expected KEY=VALUE, got "${line}"`);
    out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
  }
  return out;
}

async function createTopic(event) {
  event.preventDefault();
  const result = $("create-topic-result");
  result.className = "";
  result.textContent = "creating...";
  try {
    const body = { name: $("new-topic-name").value.trim(), configs: parseConfigs($("new-topic-configs").value) };
    const partitions = $("new-topic-partitions").value;
    const rf = $("new-topic-rf").value;
    if (partitions !== "") body.partitions = Number(partitions);
    if (rf !== "") body.replication_factor = Number(rf);
    const doc = await api("/api/topics", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    result.className = "ok";
    result.textContent = `Created topic ${doc.created}.`;
    await refreshTopics();
  } catch (e) {
    result.className = "error";
    result.textContent = e.message;
  }
}

// ------------------------------------------------------------------ groups

async function refreshGroups() {
  const doc = await api("/api/groups");
  showStatus(doc);
  fillBody("groups-table", doc.groups.map((g) =>
    el("tr", { dataset: { group: g.group },
               class: [state.arg === g.group ? "selected" : "", g.error ? "outage" : ""].join(" ").trim() || null },
       el("td", { dataset: { col: "group" } },
          el("a", { href: `#groups/${encodeURIComponent(g.group)}` }, g.group)),
       td("state", g.error ? `${g.state} (last known)` : g.state), td("members", g.members, "num"),
       td("topics", g.topics.join(", ")),
       g.error ? el("td", { dataset: { col: "lag" }, class: "error", title: g.error },
                    `unknown: ${g.error} since ${timeText(g.error_since_ms)}`)
               : td("lag", g.lag, "num"))));
  const note = $("groups-note");
  note.hidden = doc.groups_total <= doc.groups.length;
  note.textContent = `Showing the first ${doc.groups.length} of ${doc.groups_total} groups (by id).`;
  $("group-detail").hidden = !state.arg;
  if (state.arg) await refreshGroupDetail(state.arg);
}

async function refreshGroupDetail(group) {
  $("group-detail-name").textContent = group;
  const path = encodeURIComponent(group);
  let doc;
  let series;
  try {
    [doc, series] = await Promise.all([api(`/api/groups/${path}`), api(`/api/series/lag/${path}`)]);
  } catch (e) {
    $("group-state").textContent = e.message;
    return;
  }
  $("group-state").textContent = doc.state;
  $("group-total-lag").textContent = doc.total_lag;
  // one total per group on the page (issue 26): the table's sampled total and the chart's
  // last point become this newer one, asked just now
  const row = document.querySelector(`#groups-table tr[data-group="${CSS.escape(group)}"]`);
  const cell = row && row.querySelector('td[data-col="lag"]');
  if (cell && !cell.classList.contains("error")) cell.textContent = doc.total_lag;
  series.series.t.push(Date.now());
  series.series.v.push(doc.total_lag);
  fillBody("members-table", doc.members.length ? doc.members.map((m) =>
    el("tr", { dataset: { member: m.member_id } },
       td("member_id", m.member_id), td("client_id", m.client_id), td("host", m.host),
       td("assignment", m.assignment.map((a) => `${a.topic}-${a.partition}`).join(", "))))
    : [el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no active members"))]);
  // a share group (KIP-932): the share-partition start offset instead of a committed
  // offset, every member sharing the partition, and its records in flight and archived
  const share = doc.type === "share";
  $("group-offset-header").textContent = share ? "Start offset" : "Committed";
  document.querySelectorAll("#group-partitions-table .share-only").forEach((th) => {
    th.hidden = !share;
  });
  fillBody("group-partitions-table", doc.partitions.map((p) =>
    el("tr", { dataset: { topic: p.topic, partition: p.partition } },
       td("topic", p.topic), td("partition", p.partition, "num"),
       td(share ? "start_offset" : "committed_offset", p.committed_offset, "num"),
       td("high_watermark", p.high_watermark, "num"), td("lag", p.lag, "num"),
       td("member_id", p.member_id),
       ...(share ? [td("in_flight", p.in_flight, "num"), td("archived", p.archived, "num")]
                 : []))));
  drawLag(group, series.series);
}

// ------------------------------------------------------------------ messages

function fillTopicChoices(selected) {
  const select = $("msg-topic");
  const names = state.topics.map((t) => t.name);
  if (selected && !names.includes(selected)) names.push(selected);
  const current = selected || select.value;
  select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (current) select.value = current;
}

function showMode() {
  const mode = $("msg-mode").value;
  $("msg-offset-label").hidden = mode !== "offset";
  $("msg-timestamp-label").hidden = mode !== "timestamp";
}

// A key, value or header value: text, JSON pretty-printed, or base64 marked as such.
function payload(obj, name, prettyJson) {
  const v = obj[name];
  if (v === null || v === undefined) return el("span", { class: "null" }, "null");
  const note = obj[`${name}_truncated`] ? el("div", { class: "muted" },
    `(first 64 KiB of ${obj[`${name}_size`]} bytes)`) : null;
  if (obj[`${name}_encoding`] === "base64") {
    return el("div", {}, el("pre", { class: "binary", title: "not UTF-8: shown as base64" }, v),
              el("span", { class: "badge" }, "base64"), note);
  }
  if (prettyJson) {
    try {
      const parsed = JSON.parse(v);
      if (parsed !== null && typeof parsed === "object") {
        return el("div", {}, el("pre", { class: "json" }, JSON.stringify(parsed, null, 2)), note);
      }
    } catch (e) { /* not JSON: shown as text */ }
  }
  return el("div", {}, el("pre", { class: "text" }, v), note);
}

async function readMessages(event) {
  if (event) event.preventDefault();
  const params = new URLSearchParams({
    topic: $("msg-topic").value, partition: $("msg-partition").value, limit: $("msg-limit").value });
  const mode = $("msg-mode").value;
  if (mode === "offset") params.set("offset", $("msg-offset").value);
  if (mode === "timestamp") {
    const t = new Date($("msg-timestamp").value).getTime();
    if (Number.isNaN(t)) { $("msg-status").textContent = "give a time"; return; }
    params.set("timestamp", String(t));
  }
  history.replaceState(null, "", `#messages?${params}`);
  $("msg-status").textContent = "reading...";
  try {
    const doc = await api(`/api/messages?${params}`);
    const rows = doc.records.map((r) => el("tr", { dataset: { offset: r.offset } },
      td("offset", r.offset, "num"),
      el("td", { dataset: { col: "timestamp" }, title: `${r.timestamp} (${r.timestamp_type})` }, timeText(r.timestamp)),
      el("td", { dataset: { col: "key" } }, payload(r, "key", false)),
      el("td", { dataset: { col: "value" } }, payload(r, "value", true)),
      el("td", { dataset: { col: "headers" } }, ...r.headers.map((h) =>
        el("div", { class: "header", dataset: { key: h.key } }, `${h.key}: `,
           h.value === null ? el("span", { class: "null" }, "null") : h.value)))));
    fillBody("messages-table", rows);
    $("msg-status").className = "muted";
    $("msg-status").textContent = `${doc.records.length} record(s) of ${doc.topic}-${doc.partition} ` +
      `from offset ${doc.start_offset} (log start ${doc.log_start_offset}, high watermark ${doc.high_watermark})`;
  } catch (e) {
    fillBody("messages-table", []);
    $("msg-status").className = "error";
    $("msg-status").textContent = e.message;
  }
}

async function enterMessages(query) {
  if (state.topics.length === 0) state.topics = (await api("/api/topics")).topics;
  const q = new URLSearchParams(query || "");
  fillTopicChoices(q.get("topic"));
  if (q.has("partition")) $("msg-partition").value = q.get("partition");
  if (q.has("limit")) $("msg-limit").value = q.get("limit");
  if (q.has("offset")) { $("msg-mode").value = "offset"; $("msg-offset").value = q.get("offset"); }
  showMode();
  if (q.has("topic")) await readMessages(null);
}

// ------------------------------------------------------------------ routing and refresh

const REFRESH = { overview: refreshOverview, topics: refreshTopics, groups: refreshGroups };

function decoded(text) {
  try { return decodeURIComponent(text); } catch (e) { return text; } // a malformed %xx
}

function route() {
  const hash = decoded(location.hash.replace(/^#/, "")) || "overview";
  const [head, query] = location.hash.replace(/^#/, "").split("?");
  const [view, ...rest] = (head || "overview").split("/");
  state.view = ["overview", "topics", "groups", "messages"].includes(view) ? view : "overview";
  state.arg = rest.length ? decoded(rest.join("/")) : null;
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = section.dataset.view !== state.view;
  }
  for (const a of document.querySelectorAll("#tabs a")) {
    a.classList.toggle("active", a.dataset.tab === state.view);
  }
  document.body.dataset.view = hash;
  if (state.view === "messages") enterMessages(query).catch((e) => banner(e.message));
  else refresh();
}

async function refresh() {
  const fn = REFRESH[state.view];
  if (!fn) return;
  if (state.busy) { state.again = true; return; } // once the running refresh ends
  state.busy = true;
  try {
    await fn();
    document.body.dataset.loaded = state.view;
  } catch (e) {
    banner(`The console does not answer: ${e.message}`);
  } finally {
    state.busy = false;
  }
  if (state.again) { state.again = false; refresh(); }
}

async function start() {
  try {
    const cfg = await api("/api/config");
    state.intervalMs = Math.max(200, cfg.interval_s * 1000);
    document.title = `headrace console: ${cfg.bootstrap}`;
  } catch (e) {
    banner(`The console does not answer: ${e.message}`);
  }
  $("create-topic-form").addEventListener("submit", createTopic);
  $("messages-form").addEventListener("submit", readMessages);
  $("msg-mode").addEventListener("change", showMode);
  $("show-internal").addEventListener("change", refresh);
  window.addEventListener("hashchange", route);
  route();
  setInterval(refresh, state.intervalMs);
}

document.addEventListener("DOMContentLoaded", start);
