// The offset reset of a consumer's page: POST /admin/consumers/{c}/reset, first with
// `dryRun: true` (each queue's move is listed, nothing moves); Apply is enabled only by a dry
// run of exactly the request the form describes now, and any change disables it again.
"use strict";

import { act, seg } from "./api.js";
import { topicsOf } from "./consumers.js";
import { settings } from "./settings.js";
import { $, confirmed, el, fill, fmtNum, output, td } from "./ui.js";

const reset = {
  consumer: null,
  preview: null, // {body, moved}: the request the last dry run answered for
};

/** A new consumer's page: no preview carried over from another. */
export function resetFor(consumer) {
  if (reset.consumer === consumer) return;
  reset.consumer = consumer;
  reset.preview = null;
  $("rs-apply").disabled = true;
  $("rs-table").hidden = true;
  output("rs-result").clear();
}

/** The topics to pick from: the registration's, else those the consumer has queues of. */
export function fillTopics(c) {
  const sel = $("rs-topic");
  const s = settings();
  const topics = s && s.topics ? s.topics : c ? topicsOf(c) : [];
  const have = [...sel.options].map((o) => o.value);
  if (have.join("\n") === topics.join("\n")) return;
  const keep = sel.value;
  sel.replaceChildren(...topics.map((t) => el("option", { value: t, text: t })));
  if (topics.includes(keep)) sel.value = keep;
}

/** The reset request the form describes, or a reason it is not one. */
function resetRequest() {
  const body = { topic: $("rs-topic").value, to: $("rs-to").value };
  if (!body.topic) return "Pick a topic (the consumer reads none yet).";
  const queue = $("rs-queue").value.trim();
  if (queue) body.queue = queue;
  const client = $("rs-client").value.trim();
  if (client) body.clientId = client;
  if (body.to === "timestamp") {
    const t = $("rs-time").value;
    const ms = t ? new Date(t).getTime() : NaN;
    if (Number.isNaN(ms)) return "Enter the time to reset to.";
    body.timestamp = ms;
  }
  if (body.to === "offset") {
    const v = $("rs-offset").value.trim();
    if (!/^\d+$/.test(v)) return "Enter the offset (a whole number).";
    body.offset = Number(v);
  }
  return body;
}

function drawReset(r, dry) {
  const rows = r.queues.map((q) => el("tr", {},
    td(q.clientId === null ? "–" : q.clientId), td(q.queue),
    td(q.from === null ? "never read" : fmtNum(q.from), "num"), td(fmtNum(q.to), "num"),
    td(q.from === q.to ? "stays" : q.from === null || q.to > q.from ?
      `+${fmtNum(q.to - (q.from || 0))}` : `−${fmtNum(q.from - q.to)}`, "num")));
  fill($("rs-table"), rows);
  const of = `${r.moved} of ${r.queues.length} queue(s)`;
  $("rs-caption").textContent = dry ? `Dry run: ${of} would move` :
    `Reset: ${of} moved`;
  $("rs-table").hidden = false;
}

async function previewReset(ev) {
  ev.preventDefault();
  const out = output("rs-result");
  reset.preview = null;
  $("rs-apply").disabled = true;
  const body = resetRequest();
  if (typeof body === "string") return out.fail(body);
  const r = await act(out, "POST", `/admin/consumers/${seg(reset.consumer)}/reset`,
    { ...body, dryRun: true });
  if (!r) { $("rs-table").hidden = true; return; }
  drawReset(r.data, true);
  reset.preview = { body, moved: r.data.moved };
  $("rs-apply").disabled = false;
  out.ok(`Dry run: nothing moved. ${r.data.moved} queue(s) would move; apply to move them.`);
}

async function applyReset() {
  const out = output("rs-result");
  const body = resetRequest();
  if (!reset.preview || JSON.stringify(body) !== JSON.stringify(reset.preview.body)) {
    $("rs-apply").disabled = true;
    return out.fail("The form changed since the dry run: preview again.");
  }
  if (!confirmed(`Reset ${reset.preview.moved} queue(s) of consumer ${reset.consumer} on topic ` +
      `${body.topic} to ${body.to}? Offsets move at once; this cannot be undone.`)) return;
  const r = await act(out, "POST", `/admin/consumers/${seg(reset.consumer)}/reset`, body);
  reset.preview = null;
  $("rs-apply").disabled = true;
  if (!r) return;
  drawReset(r.data, false);
  out.ok(`Reset done: ${r.data.moved} queue(s) moved.`);
}

function resetChanged() {
  const to = $("rs-to").value;
  $("rs-time-field").hidden = to !== "timestamp";
  $("rs-offset-field").hidden = to !== "offset";
  if (reset.preview) {
    reset.preview = null;
    $("rs-apply").disabled = true;
    output("rs-result").clear();
  }
}

export function initReset() {
  $("reset-form").addEventListener("submit", previewReset);
  $("rs-apply").addEventListener("click", applyReset);
  $("reset-form").addEventListener("input", resetChanged);
  $("reset-form").addEventListener("change", resetChanged);
}
