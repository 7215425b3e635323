// A consumer's dead letters: GET /admin/consumers/{c}/dead-letters (count, age, the oldest 20
// not yet redriven), a record's every field and header on Inspect, and redrive (all, or one
// queue up to a record) to the consumer's retry topic or the original topic.
// Keys, values and headers are whatever producers wrote: they go into the page as text only.
"use strict";

import { act, seg } from "./api.js";
import { $, button, confirmed, el, fill, fmtNum, fmtTime, output, td } from "./ui.js";

const LIMIT = 20;
const PREVIEW = 40; // characters of a value shown in the table

const dead = { consumer: null, listing: null };

function where(rec) {
  return rec.queue !== undefined ? rec.queue : String(rec.partition);
}

function header(rec, name) {
  const h = (rec.headers || []).find(([k]) => k === name);
  return h ? h[1] : null;
}

function clip(text) {
  if (text === null || text === undefined) return "(none)";
  return text.length > PREVIEW ? `${text.slice(0, PREVIEW)}…` : text;
}

export async function loadDeadLetters(consumer) {
  dead.consumer = consumer;
  const out = output("dl-result");
  const r = await act(out, "GET", `/admin/consumers/${seg(consumer)}/dead-letters?limit=${LIMIT}`);
  if (!r || dead.consumer !== consumer) return;
  dead.listing = r.data;
  draw();
}

function draw() {
  const d = dead.listing;
  const s = $("dl-summary");
  if (!d.exists || d.count === 0) {
    s.textContent = `No dead letters in ${d.deadLetterTopic}` +
      (d.exists ? " waiting to be redriven." : " (the topic is made at the first one).");
  } else {
    s.textContent = `${fmtNum(d.count)} dead letter(s) in ${d.deadLetterTopic} not yet ` +
      `redriven; the oldest failed ${fmtTime(d.oldestMs)}.` +
      (d.count > d.messages.length ? ` The oldest ${d.messages.length} are listed.` : "");
  }
  $("dl-redrive-all").disabled = !d.count;
  $("dl-table").hidden = !d.messages.length;
  fill($("dl-table"), d.messages.map((rec) => {
    const at = `${where(rec)}@${rec.offset}`;
    return el("tr", { "data-record": at },
      td(where(rec)), td(fmtNum(rec.offset), "num"), td(String(rec.attempt), "num"),
      td(fmtTime(Number(header(rec, "mqgw-last-failure-ms") ?? rec.timestamp))),
      td(clip(rec.key)), td(clip(rec.value)),
      el("td", { class: "buttons" },
        button("Inspect", `Inspect dead letter ${at}`, () => inspect(rec)),
        button("Redrive to here", `Redrive queue ${where(rec)} up to ${at}`,
          () => redrive(rec))));
  }));
}

function inspect(rec) {
  const at = `${where(rec)}@${rec.offset}`;
  $("dl-inspect-title").textContent = `Dead letter ${at}`;
  const fields = [
    ["Queue", where(rec)], ["Offset", String(rec.offset)], ["Attempts", String(rec.attempt)],
    ["Written", fmtTime(rec.timestamp)], ["Encoding", rec.encoding || "utf-8"],
    ["Origin", `${header(rec, "mqgw-origin-topic") ?? "?"} ` +
      `queue ${header(rec, "mqgw-origin-partition") ?? "?"} ` +
      `offset ${header(rec, "mqgw-origin-offset") ?? "?"}`],
    ["Last failure", fmtTime(Number(header(rec, "mqgw-last-failure-ms") ?? -1))],
    ["Key", rec.key === null ? "(none)" : rec.key],
    ["Value", rec.value === null ? "(none: a tombstone)" : rec.value],
  ];
  $("dl-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", { text: k }),
    el("dd", { class: "raw", text: v })]));
  fill($("dl-headers"), (rec.headers || []).map(([k, v]) => el("tr", {},
    td(k, "raw"), td(v === null ? "(no value)" : v, "raw"))));
  $("dl-inspect").hidden = false;
  $("dl-inspect-title").focus();
}

async function redrive(rec) {
  const target = $("dl-target").value;
  const out = output("dl-result");
  const body = { target };
  let what = `every dead letter of ${dead.consumer}`;
  if (rec) {
    if (rec.queue !== undefined) body.queue = rec.queue; else body.partition = rec.partition;
    body.toOffset = rec.offset + 1;
    what = `the dead letters of queue ${where(rec)} up to offset ${rec.offset}`;
  }
  const to = target === "consumer" ? `consumer ${dead.consumer}'s retry topic` :
    "the topic each was produced to (every consumer of it reads it again)";
  if (!confirmed(`Redrive ${what} to ${to}?`)) return;
  const r = await act(out, "POST", `/admin/consumers/${seg(dead.consumer)}/dead-letters/redrive`,
    body);
  if (!r) return;
  out.ok(`Redriven: ${fmtNum(r.data.redriven)} record(s) sent to ${to}.`);
  $("dl-inspect").hidden = true;
  await loadDeadLetters(dead.consumer);
}

export function initDeadLetters() {
  $("dl-refresh").addEventListener("click", () => dead.consumer && loadDeadLetters(dead.consumer));
  $("dl-redrive-all").addEventListener("click", () => redrive(null));
  $("dl-close").addEventListener("click", () => { $("dl-inspect").hidden = true; });
}
