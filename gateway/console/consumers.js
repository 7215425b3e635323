// The consumers list: GET /admin/backlog every 2 s (console.js drives it), with a sparkline of
// the backlog and a rate of acknowledged records from this page's own samples, filter, sort,
// and pause/resume; the backlog alerts (GET /admin/alerts, evaluated on request); registering
// a consumer (PUT /admin/consumers/{c}).
"use strict";

import { act, seg } from "./api.js";
import { $, button, confirmed, el, fill, fmtAge, fmtNum, fmtTime, keepingFocus, list, names,
  output, problem, sparkline, td } from "./ui.js";

const TREND = 30; // backlog samples kept per consumer for its sparkline

export const consumers = {
  list: [],
  sort: { by: "backlog", desc: true },
  trend: new Map(), // consumer -> recent total backlogs
  rate: new Map(), // consumer -> records acknowledged per second between the last two samples
  last: new Map(), // consumer -> {t, committed}: the previous sample
};

/** The topics it reads (its retry topic is the gateway's, shown apart on its page). */
export function topicsOf(c) {
  return [...new Set(c.queues.filter((q) => !q.retry).map((q) => q.topic))].sort();
}

/** Why the list is empty when a key is missing or refused (console.js sets it; "" otherwise). */
export const listing = { refused: "" };

export function stateOf(c) {
  const parts = [c.paused ? "paused" : "running", c.registered ? "registered" : "open mode"];
  const a = c.alerts || {};
  if ((a.backlogMessages && c.totalBacklog >= a.backlogMessages) ||
      (a.oldestAgeMs && c.oldestAgeMs !== null && c.oldestAgeMs >= a.oldestAgeMs)) {
    parts.push("alert");
  }
  return parts.join(", ");
}

export function fmtRate(r) {
  if (r === undefined || r === null) return "–";
  return r >= 100 ? `${Math.round(r).toLocaleString("en")}/s` : `${r.toFixed(1)}/s`;
}

/** Take one sample: the list (or, `partial`, some consumers of it), each consumer's backlog
 * trend and acknowledged-record rate. A reset that moved offsets back would read as a negative
 * rate: shown as unknown instead. */
export function sample(list, partial = false) {
  const now = performance.now();
  const fresh = new Set(list.map((c) => c.consumer));
  consumers.list = partial ?
    consumers.list.filter((c) => !fresh.has(c.consumer)).concat(list) : list;
  for (const c of list) {
    const t = consumers.trend.get(c.consumer) || [];
    t.push(c.totalBacklog);
    if (t.length > TREND) t.shift();
    consumers.trend.set(c.consumer, t);
    const committed = c.queues.reduce((s, q) => s + q.committedOffset, 0);
    const prev = consumers.last.get(c.consumer);
    if (prev && now > prev.t) {
      const r = ((committed - prev.committed) * 1000) / (now - prev.t);
      consumers.rate.set(c.consumer, r >= 0 ? r : null);
    }
    consumers.last.set(c.consumer, { t: now, committed });
  }
}

function sortKey(c, by) {
  switch (by) {
    case "consumer": return c.consumer;
    case "mode": return c.mode || "";
    case "topics": return topicsOf(c).join(",");
    case "backlog": return c.totalBacklog;
    case "age": return c.oldestAgeMs === null ? -1 : c.oldestAgeMs;
    case "rate": return consumers.rate.get(c.consumer) ?? -1;
    default: return stateOf(c);
  }
}

export function drawConsumers() {
  keepingFocus(draw);
}

function draw() {
  const filter = $("filter").value.trim().toLowerCase();
  const rows = consumers.list.filter((c) => !filter || c.consumer.toLowerCase().includes(filter) ||
    topicsOf(c).some((t) => t.toLowerCase().includes(filter)));
  const { by, desc } = consumers.sort;
  rows.sort((a, b) => {
    const x = sortKey(a, by), y = sortKey(b, by);
    const o = x < y ? -1 : x > y ? 1 : a.consumer < b.consumer ? -1 : 1;
    return desc ? -o : o;
  });
  fill($("consumers"), rows.map((c) => el("tr", { "data-consumer": c.consumer },
    el("td", {}, el("a", { href: `#consumer/${seg(c.consumer)}`, text: c.consumer,
                           "aria-label": `open consumer ${c.consumer}` })),
    td(c.mode || "–"),
    td(topicsOf(c).join(", ") || "–"),
    td(fmtNum(c.totalBacklog), "num"),
    el("td", {}, sparkline(consumers.trend.get(c.consumer) || [])),
    td(fmtAge(c.oldestAgeMs), "num"),
    td(fmtRate(consumers.rate.get(c.consumer)), "num"),
    td(stateOf(c), c.paused ? "paused" : ""),
    el("td", {}, pauseButton(c)))));
  $("empty").hidden = consumers.list.length > 0;
  $("empty").textContent = listing.refused ||
    "No consumers yet: a consumer is listed once it fetched or was registered.";
  for (const btn of document.querySelectorAll("#consumers th button[data-sort]")) {
    btn.parentElement.setAttribute("aria-sort",
      btn.dataset.sort === by ? (desc ? "descending" : "ascending") : "none");
  }
}

export function pauseButton(c) {
  const verb = c.paused ? "Resume" : "Pause";
  return button(verb, `${verb} ${c.consumer}`, () => pause(c.consumer, !c.paused));
}

let refreshAll = async () => {};

function drawAlerts(data) {
  const firing = data.alerts.map((a) => a.reasons.includes("overdue") ?
    `the delay wheel (records ${fmtAge(a.oldestAgeMs)} overdue: is a relay running?)` :
    `${a.consumer} (${a.reasons.join(" and ")})`);
  const when = data.evaluatedMs ? ` Last evaluated ${fmtTime(data.evaluatedMs)}.` : "";
  $("al-summary").textContent = (firing.length ? `Firing: ${list(firing)}.` :
    "No backlog alert fires.") + when;
}

/** The alerts that fire, as the last evaluation left them. */
export async function loadAlerts() {
  const out = output("al-result");
  const r = await act(out, "GET", "/admin/alerts");
  if (!r) return;
  out.clear(); // an earlier failure (before a key was entered) is over
  drawAlerts(r.data);
}

async function evaluate() {
  const out = output("al-result");
  const r = await act(out, "POST", "/admin/alerts/evaluate");
  if (!r) return;
  drawAlerts(r.data);
  out.ok(`Evaluated: ${r.data.alerts.length} alert(s) firing.`);
}

async function register(ev) {
  ev.preventDefault();
  const out = output("rg-result");
  const name = $("rg-name").value.trim();
  const body = { topics: names($("rg-topics").value), mode: $("rg-mode").value,
    start: $("rg-start").value };
  if (!name) return out.fail("Enter the consumer's name.");
  if (!confirmed(`Register consumer ${name} for ${list(body.topics)} (${body.mode} mode, start ` +
      `${body.start})? An existing registration is replaced (offsets are kept).`)) return;
  const r = await act(out, "PUT", `/admin/consumers/${seg(name)}`, body);
  if (!r) return;
  out.ok(`${r.status === 201 ? "Registered" : "Registration replaced"}: ${name}.`);
  await refreshAll();
}

export function initConsumers(refresh) {
  refreshAll = refresh;
  $("register-form").addEventListener("submit", register);
  $("al-evaluate").addEventListener("click", evaluate);
  $("filter").addEventListener("input", drawConsumers);
  for (const btn of document.querySelectorAll("#consumers th button[data-sort]")) {
    btn.addEventListener("click", () => {
      const by = btn.dataset.sort;
      consumers.sort = { by, desc: consumers.sort.by === by ? !consumers.sort.desc :
        ["backlog", "age", "rate"].includes(by) };
      drawConsumers();
    });
  }
}

async function pause(consumer, paused) {
  const verb = paused ? "Pause" : "Resume";
  const what = paused ? "its fetches will answer 'paused' on every node" :
    "its fetches continue at the committed offsets";
  if (!confirmed(`${verb} consumer ${consumer}? (${what})`)) return;
  const out = { fail: (t) => problem(`${verb} ${consumer}: ${t}`) };
  if (await act(out, "POST", `/admin/consumers/${seg(consumer)}/${paused ? "pause" : "resume"}`)) {
    await refreshAll();
  }
}
