// A consumer's settings (GET /admin/consumers/{c}) and the forms that change them with
// PATCH /admin/consumers/{c}, a JSON merge patch: a form sends only the fields the operator
// changed, an emptied field as null (back to the gateway's default), so what it leaves alone
// keeps its value. Also: unregister (DELETE, optionally with the offsets).
"use strict";

import { act, seg } from "./api.js";
import { $, confirmed, el, fmtNum, fmtTime, list, names, output } from "./ui.js";

const state = { consumer: null, settings: null };
let onChange = () => {};

/** Each form's fields: input id -> [path in the patch, kind]. */
const GENERAL = {
  "st-topics": ["topics", "names"], "st-mode": ["mode", "text"],
  "st-timeout": ["consumeTimeoutMs", "int"], "st-batch": ["maxBatch", "int"],
  "st-start": ["start", "text"], "st-backlog": ["alerts.backlogMessages", "int"],
  "st-age": ["alerts.oldestAgeMs", "int"],
};
const RETRY = {
  "rt-max": ["retry.maxAttempts", "int"], "rt-delays": ["retry.delaysMs", "ints"],
  "rt-initial": ["retry.initialDelayMs", "int"], "rt-mult": ["retry.multiplier", "number"],
  "rt-maxdelay": ["retry.maxDelayMs", "int"], "rt-dlt": ["retry.deadLetterTopic", "text"],
};

function get(obj, path) {
  return path.split(".").reduce((o, k) => (o === null || o === undefined ? undefined : o[k]), obj);
}

function shown(v) {
  if (v === undefined || v === null) return "";
  return Array.isArray(v) ? v.join(", ") : String(v);
}

/** What a field holds as the API wants it; a string is the reason it cannot be sent. */
function parse(id, kind, text) {
  const label = $(id).labels[0].textContent;
  if (kind === "text") return text;
  if (kind === "names") return names(text);
  if (kind === "ints") {
    const parts = names(text);
    return parts.every((x) => /^\d+$/.test(x)) ? parts.map(Number) :
      new Error(`${label}: whole numbers, separated by commas.`);
  }
  if (kind === "int" && !/^\d+$/.test(text)) return new Error(`${label}: a whole number, please.`);
  const n = Number(text);
  return Number.isNaN(n) ? new Error(`${label}: a number, please.`) : n;
}

/** The merge patch of the fields that changed since the settings were drawn. */
function changed(fields) {
  const patch = {};
  for (const [id, [path, kind]] of Object.entries(fields)) {
    const now = $(id).value.trim();
    if (now === ($(id).dataset.was || "")) continue;
    const value = now === "" ? null : parse(id, kind, now);
    if (value instanceof Error) return value;
    const keys = path.split(".");
    let at = patch;
    for (const k of keys.slice(0, -1)) at = at[k] = at[k] || {};
    at[keys[keys.length - 1]] = value;
  }
  return patch;
}

function put(fields) {
  for (const [id, [path]] of Object.entries(fields)) {
    const v = shown(get(state.settings, path));
    $(id).value = v;
    $(id).dataset.was = v;
  }
}

export function retryText(p) {
  if (!p) return "the gateway's default (5 attempts, 1 s doubling up to 10 min)";
  const parts = [];
  if (p.maxAttempts !== undefined) parts.push(`${p.maxAttempts} attempts`);
  if (p.delaysMs) parts.push(`delays ${p.delaysMs.join(", ")} ms`);
  if (p.initialDelayMs !== undefined) parts.push(`first delay ${p.initialDelayMs} ms`);
  if (p.multiplier !== undefined) parts.push(`× ${p.multiplier}`);
  if (p.maxDelayMs !== undefined) parts.push(`at most ${p.maxDelayMs} ms`);
  if (p.deadLetterTopic) parts.push(`dead letters to ${p.deadLetterTopic}`);
  return parts.join(", ");
}

function draw() {
  const s = state.settings;
  const rl = s.rateLimit;
  const a = s.alerts;
  const rows = [
    ["Registered", s.registered ? "yes" : "no (open mode)"],
    ["Mode", s.mode || "either (not registered)"],
    ["Topics", s.topics ? list(s.topics) : "any (not registered)"],
    ["Paused", s.paused ? "yes" : "no"],
    ["Lock timeout", `${fmtNum(s.consumeTimeoutMs)} ms`],
    ["Largest batch", fmtNum(s.maxBatch)],
    ["Start", s.start],
    ["Rate limit", rl ? `${rl.messagesPerSecond}/s, bursts of ${rl.burst}` : "none"],
    ["Retry policy", retryText(s.retry)],
    ["Alerts", a ? Object.entries(a).map(([k, v]) => `${k} ${v}`).join(", ") : "none"],
    ["Changed", fmtTime(s.updatedMs)],
  ];
  $("settings").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }),
    el("dd", { text: v })]));
  $("rl-rate").value = rl ? String(rl.messagesPerSecond) : "";
  $("rl-burst").value = rl ? String(rl.burst) : "";
  put(GENERAL);
  put(RETRY);
}

export async function loadSettings(consumer) {
  state.consumer = consumer;
  const r = await act(output("st-result"), "GET", `/admin/consumers/${seg(consumer)}`);
  if (!r || state.consumer !== consumer) return;
  state.settings = r.data;
  draw();
  onChange(r.data);
}

/** The settings read last (null before). */
export function settings() {
  return state.settings;
}

async function patch(out, body, what) {
  if (!confirmed(`Change ${what} of consumer ${state.consumer}? (on every node from its next ` +
      "request)")) return;
  const r = await act(out, "PATCH", `/admin/consumers/${seg(state.consumer)}`, body);
  if (!r) return;
  state.settings = r.data;
  draw();
  onChange(r.data);
  out.ok(`Saved: ${what === "the retry policy" ? `retry policy ${retryText(r.data.retry)}` :
    what === "the rate limit" ? `rate limit ${r.data.rateLimit ?
      `${r.data.rateLimit.messagesPerSecond}/s` : "none"}` : Object.keys(body).join(", ")}.`);
}

function patchForm(fields, outId, what) {
  return async (ev) => {
    ev.preventDefault();
    const out = output(outId);
    const body = changed(fields);
    if (body instanceof Error) return out.fail(body.message);
    if (!Object.keys(body).length) return out.fail("Nothing changed.");
    await patch(out, body, what);
  };
}

async function saveRate(ev) {
  ev.preventDefault();
  const out = output("rl-result");
  const rate = $("rl-rate").value.trim(), burst = $("rl-burst").value.trim();
  if (rate === "") return out.fail("Enter records per second (or remove the limit).");
  if (Number.isNaN(Number(rate)) || (burst !== "" && !/^\d+$/.test(burst))) {
    return out.fail("Rate and burst are numbers (the burst a whole one).");
  }
  await patch(out, { rateLimit: { messagesPerSecond: Number(rate),
    burst: burst === "" ? null : Number(burst) } }, "the rate limit");
}

async function unregister(ev) {
  ev.preventDefault();
  const out = output("un-result");
  const offsets = $("un-offsets").checked;
  if (!confirmed(`Unregister consumer ${state.consumer}${offsets ? " and delete its offsets " +
      "(a later consumer of this name starts afresh)" : " (its offsets are kept)"}?`)) return;
  const q = offsets ? "?deleteOffsets=true" : "";
  const r = await act(out, "DELETE", `/admin/consumers/${seg(state.consumer)}${q}`);
  if (!r) return;
  out.ok(`Unregistered${r.data.offsetsDeleted ? ", offsets deleted" : ""}.`);
  await loadSettings(state.consumer);
}

export function initSettings(changedHook) {
  onChange = changedHook;
  $("general-form").addEventListener("submit", patchForm(GENERAL, "st-result", "settings"));
  $("rate-form").addEventListener("submit", saveRate);
  $("rl-remove").addEventListener("click", () =>
    patch(output("rl-result"), { rateLimit: null }, "the rate limit"));
  $("retry-form").addEventListener("submit", patchForm(RETRY, "rt-result", "the retry policy"));
  $("rt-default").addEventListener("click", () =>
    patch(output("rt-result"), { retry: null }, "the retry policy"));
  $("unregister-form").addEventListener("submit", unregister);
}
