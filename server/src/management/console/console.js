// The leasemqd console: one page over the management API (/api/), no libraries.
// It polls only the tab in view, every five seconds, and not at all while the page is
// hidden, so that a console left open costs the broker little.
"use strict";

const POLL_MS = 5000;
const PAGE_SIZE = 50;
const state = { auth: sessionStorage.getItem("auth"), tab: "overview", page: 1, queue: null, timer: null };
const $ = (id) => document.getElementById(id);

// ---- the API -----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.reason) || `HTTP ${status}`);
    this.status = status;
  }
}

async function api(method, path, body) {
  // X-Requested-With: a refusal then comes without WWW-Authenticate, and the browser
  // leaves the login to this page rather than asking for credentials itself.
  const init = { method, headers: { Authorization: state.auth, "X-Requested-With": "XMLHttpRequest" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  const json = text ? JSON.parse(text) : null;
  if (!res.ok) {
    if (res.status === 401 && method === "GET") logout("Your session ended: log in again.");
    throw new ApiError(res.status, json);
  }
  return json;
}

const seg = encodeURIComponent;

// ---- numbers and charts ------------------------------------------------------------------

function fmt(n) {
  if (n === undefined || n === null) return "–";
  if (typeof n !== "number") return String(n);
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

const rate = (details) => (details && typeof details.rate === "number" ? details.rate : 0);

// Points (t, v) of a counter's samples (newest first) as rates per second.
function ratesOf(samples) {
  const points = [];
  for (let i = samples.length - 1; i > 0; i--) {
    const older = samples[i], newer = samples[i - 1];
    const dt = (newer.timestamp - older.timestamp) / 1000;
    if (dt > 0) points.push([newer.timestamp, Math.max(0, (newer.sample - older.sample) / dt)]);
  }
  return points;
}

// Points (t, v) of a gauge's samples (newest first).
const levelsOf = (samples) => samples.slice().reverse().map((s) => [s.timestamp, s.sample]);

const COLOURS = ["#2f6fdb", "#27ae60", "#e67e22", "#8e44ad"];

// Draws `series` ([name, points]) on `canvas`, on one scale, with a legend.
function chart(canvas, series) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 36;
  ctx.clearRect(0, 0, w, h);
  const all = series.flatMap(([, pts]) => pts);
  ctx.font = "12px system-ui, sans-serif";
  if (all.length < 2) {
    ctx.fillStyle = "#6b7385";
    ctx.fillText("Collecting samples…", pad, h / 2);
    return;
  }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const top = Math.max(1, ...all.map((p) => p[1]));
  const x = (t) => pad + ((t - t0) / Math.max(1, t1 - t0)) * (w - pad * 2);
  const y = (v) => h - pad / 2 - (v / top) * (h - pad);
  ctx.strokeStyle = "#dde1e8";
  ctx.fillStyle = "#6b7385";
  for (const f of [0, 0.5, 1]) {
    ctx.beginPath();
    ctx.moveTo(pad, y(top * f));
    ctx.lineTo(w - pad, y(top * f));
    ctx.stroke();
    ctx.fillText(fmt(top * f), 2, y(top * f) + 4);
  }
  series.forEach(([name, pts], i) => {
    ctx.strokeStyle = COLOURS[i % COLOURS.length];
    ctx.lineWidth = 2;
    ctx.beginPath();
    pts.forEach(([t, v], j) => (j ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    ctx.fillStyle = ctx.strokeStyle;
    ctx.fillText(name, w - pad - 90, 16 + i * 14);
  });
}

const samples = (details) => (details && details.samples) || [];

// ---- tabs --------------------------------------------------------------------------------

async function overview() {
  const o = await api("GET", "/api/overview?lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5");
  $("node").textContent = `${o.node} · ${o.product_name} ${o.product_version}`;
  const q = o.queue_totals || {}, m = o.message_stats || {};
  $("total-ready").textContent = fmt(q.messages_ready);
  $("total-unacked").textContent = fmt(q.messages_unacknowledged);
  $("total-messages").textContent = fmt(q.messages);
  $("rate-publish").textContent = fmt(rate(m.publish_details));
  $("rate-deliver").textContent = fmt(rate(m.deliver_get_details));
  $("rate-ack").textContent = fmt(rate(m.ack_details));
  $("alarms").textContent = (o.alarms || []).map((a) => `Alarm: ${a.resource} on ${a.node}: publishers are blocked`).join(" · ");
  chart($("chart-rates"), [
    ["publish", ratesOf(samples(m.publish_details))],
    ["deliver", ratesOf(samples(m.deliver_get_details))],
    ["ack", ratesOf(samples(m.ack_details))],
  ]);
  chart($("chart-queued"), [
    ["ready", levelsOf(samples(q.messages_ready_details))],
    ["unacked", levelsOf(samples(q.messages_unacknowledged_details))],
  ]);
  const totals = o.object_totals || {};
  $("object-totals").replaceChildren(
    ...Object.keys(totals).map((k) => row([k, fmt(totals[k])])),
  );
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function row(cells, onClick) {
  const tr = document.createElement("tr");
  tr.append(...cells.map((c) => (c instanceof Node ? c : cell(c))));
  if (onClick) tr.addEventListener("click", onClick);
  return tr;
}

async function queues() {
  const columns = "name,vhost,type,messages,messages_ready,messages_unacknowledged,consumers," +
    "message_stats.publish_details.rate,message_stats.deliver_get_details.rate,message_stats.ack_details.rate";
  const filter = $("queue-filter").value.trim();
  const page = await api("GET", `/api/queues?page=${state.page}&page_size=${PAGE_SIZE}&sort=name` +
    `&name=${seg(filter)}&columns=${columns}`);
  if (state.page > page.page_count) state.page = page.page_count;
  $("queue-count").textContent = `${page.filtered_count} queue(s)`;
  $("queue-page").textContent = `${page.page} / ${page.page_count}`;
  $("queue-rows").replaceChildren(...page.items.map((q) => {
    const s = q.message_stats || {};
    const tr = row([q.vhost, q.name, q.type,
      cell(fmt(q.messages_ready), "n"), cell(fmt(q.messages_unacknowledged), "n"), cell(fmt(q.messages), "n"),
      cell(fmt(q.consumers), "n"), cell(fmt(rate(s.publish_details)), "n"),
      cell(fmt(rate(s.deliver_get_details)), "n"), cell(fmt(rate(s.ack_details)), "n")],
      () => openQueue(q.vhost, q.name));
    tr.dataset.queue = q.name;
    return tr;
  }));
  if (state.queue) await queueDetail();
}

function openQueue(vhost, name) {
  state.queue = { vhost, name };
  $("queue-detail").hidden = false;
  $("get-result").replaceChildren();
  $("publish-result").textContent = "";
  $("queue-action-result").textContent = "";
  queueDetail().catch(show);
}

const queuePath = () => `/api/queues/${seg(state.queue.vhost)}/${seg(state.queue.name)}`;

async function queueDetail() {
  let q;
  try {
    q = await api("GET", `${queuePath()}?lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5`);
  } catch (e) {
    if (e.status === 404) { closeQueue(); return; }
    throw e;
  }
  const s = q.message_stats || {};
  $("queue-name").textContent = q.name;
  $("queue-vhost").textContent = `in ${q.vhost}${q.durable ? " · durable" : ""}`;
  $("queue-ready").textContent = fmt(q.messages_ready);
  $("queue-unacked").textContent = fmt(q.messages_unacknowledged);
  $("queue-consumers").textContent = fmt(q.consumers);
  $("queue-publish").textContent = fmt(rate(s.publish_details));
  $("queue-deliver").textContent = fmt(rate(s.deliver_get_details));
  const args = Object.entries(q.arguments || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`);
  $("queue-arguments").textContent = args.length ? `Arguments: ${args.join(", ")}` : "";
  chart($("chart-queue"), [
    ["ready", levelsOf(samples(q.messages_ready_details))],
    ["unacked", levelsOf(samples(q.messages_unacknowledged_details))],
    ["publish /s", ratesOf(samples(s.publish_details))],
  ]);
}

function closeQueue() {
  state.queue = null;
  $("queue-detail").hidden = true;
}

async function connections() {
  const list = await api("GET", "/api/connections");
  $("connection-rows").replaceChildren(...list.map((c) => {
    const close = document.createElement("button");
    close.className = "link";
    close.textContent = "Close";
    close.addEventListener("click", async (ev) => {
      ev.stopPropagation();
      if (!(await confirmed(`Close connection ${c.name}? Its client is told 320 CONNECTION_FORCED.`))) return;
      await api("DELETE", `/api/connections/${seg(c.name)}`).catch(show);
      refresh();
    });
    const client = c.client_properties || {};
    return row([c.name, c.user, c.vhost, c.state, c.ssl ? "yes" : "", cell(fmt(c.channels), "n"),
      [client.product, client.version].filter(Boolean).join(" "), cell(close)]);
  }));
}

async function exchanges() {
  const list = await api("GET", "/api/exchanges?columns=vhost,name,type,durable,auto_delete,internal");
  $("exchange-rows").replaceChildren(...list.map((x) =>
    row([x.vhost, x.name || "(default)", x.type, x.durable ? "yes" : "", x.auto_delete ? "yes" : "",
      x.internal ? "yes" : ""])));
}

const TABS = { overview, queues, connections, exchanges };

// ---- actions -----------------------------------------------------------------------------

function confirmed(text) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
  });
}

function show(e) {
  $("queue-action-result").textContent = e.message;
}

$("queue-purge").addEventListener("click", async () => {
  const { vhost, name } = state.queue;
  if (!(await confirmed(`Purge queue ${name} in ${vhost}? Its ready messages are removed for good.`))) return;
  try {
    await api("DELETE", `${queuePath()}/contents`);
    $("queue-action-result").textContent = "Purged.";
  } catch (e) { show(e); }
  refresh();
});

$("queue-delete").addEventListener("click", async () => {
  const { vhost, name } = state.queue;
  if (!(await confirmed(`Delete queue ${name} in ${vhost}, with its messages?`))) return;
  try {
    await api("DELETE", queuePath());
    closeQueue();
  } catch (e) { show(e); }
  refresh();
});

$("publish-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const { vhost, name } = state.queue;
  try {
    const r = await api("POST", `/api/exchanges/${seg(vhost)}/amq.default/publish`, {
      routing_key: name, payload: $("publish-payload").value, payload_encoding: "string", properties: {},
    });
    $("publish-result").textContent = r.routed ? "Published." : "Not routed.";
  } catch (e) { $("publish-result").textContent = e.message; }
});

$("get-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const got = await api("POST", `${queuePath()}/get`, {
      count: Number($("get-count").value), ackmode: $("get-ackmode").value, encoding: "auto",
    });
    $("get-result").replaceChildren(...(got.length ? got.map((m) => {
      const pre = document.createElement("pre");
      pre.textContent = `${m.redelivered ? "(redelivered) " : ""}${m.payload}`;
      return pre;
    }) : [document.createTextNode("The queue is empty.")]));
  } catch (e) { $("get-result").textContent = e.message; }
  refresh();
});

$("queue-filter").addEventListener("input", () => { state.page = 1; refresh(); });
$("queue-prev").addEventListener("click", () => { state.page = Math.max(1, state.page - 1); refresh(); });
$("queue-next").addEventListener("click", () => { state.page += 1; refresh(); });

// ---- login, tabs and polling -------------------------------------------------------------

$("login").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const auth = "Basic " + btoa(`${$("login-user").value}:${$("login-password").value}`);
  try {
    state.auth = auth;
    const me = await api("GET", "/api/whoami");
    sessionStorage.setItem("auth", auth);
    loggedIn(me);
  } catch (e) {
    state.auth = null;
    $("login-error").textContent = e.status === 401 ? `Login refused: ${e.message}` : e.message;
  }
});

function loggedIn(me) {
  $("login").hidden = true;
  $("login-error").textContent = "";
  $("login-password").value = "";
  $("tabs").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = `${me.name} (${(me.tags || []).join(", ") || "no tags"})`;
  go(location.hash.slice(1) || "overview");
}

function logout(message) {
  sessionStorage.removeItem("auth");
  state.auth = null;
  clearTimeout(state.timer);
  for (const t of Object.keys(TABS)) $(t).hidden = true;
  $("tabs").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login").hidden = false;
  $("login-error").textContent = message || "";
}

$("logout").addEventListener("click", () => logout());

function go(tab) {
  if (!TABS[tab]) tab = "overview";
  state.tab = tab;
  for (const t of Object.keys(TABS)) $(t).hidden = t !== tab;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === tab);
  refresh();
}

window.addEventListener("hashchange", () => state.auth && go(location.hash.slice(1)));

async function refresh() {
  clearTimeout(state.timer);
  if (!state.auth) return;
  try {
    await TABS[state.tab]();
  } catch (e) {
    if (state.auth) console.warn(e);
  }
  if (document.visibilityState === "visible" && state.auth) {
    state.timer = setTimeout(refresh, POLL_MS);
  }
}

document.addEventListener("visibilitychange", () => document.visibilityState === "visible" && refresh());

if (state.auth) {
  api("GET", "/api/whoami").then(loggedIn).catch(() => logout());
}

// Every handler is in place: the page can be used (a test waits for this).
document.body.dataset.ready = "true";
