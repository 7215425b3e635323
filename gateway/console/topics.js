// Topics: GET /admin/topics (internal ones on request), a topic's queues on click, and
// creating one (POST /admin/topics). RocketMQ's queues are named as the broker names them
// (`broker-a.0`), Kafka's by partition number.
"use strict";

import { act } from "./api.js";
import { $, confirmed, el, fill, fmtNum, list, output, td } from "./ui.js";

const topics = { list: [], shown: null };

function queueName(p) {
  return p.queue !== undefined ? p.queue : String(p.partition);
}

function sum(parts, f) {
  return parts.every((p) => f(p) !== null) ? parts.reduce((s, p) => s + f(p), 0) : null;
}

export async function loadTopics() {
  const internal = $("tp-internal").checked ? "?internal=true" : "";
  const out = output("tp-result");
  const r = await act(out, "GET", `/admin/topics${internal}`);
  if (!r) return;
  out.ok(`${r.data.topics.length} topic(s)${internal ? ", internal ones included" : ""}.`);
  topics.list = r.data.topics;
  fill($("topics"), topics.list.map((t) => {
    const kept = sum(t.partitions, (p) => p.endOffset === null || p.earliestOffset === null ? null :
      p.endOffset - p.earliestOffset);
    return el("tr", { "data-topic": t.name },
      el("td", {}, el("button", { type: "button", class: "link", text: t.name,
        "aria-label": `show the queues of topic ${t.name}`, onclick: () => showTopic(t.name) })),
      td(String(t.partitionCount), "num"),
      td(t.replicationFactor === null ? "–" : String(t.replicationFactor), "num"),
      td(fmtNum(kept), "num"), td(fmtNum(sum(t.partitions, (p) => p.endOffset)), "num"),
      td(t.internal ? "internal" : t.name.startsWith("mqgw.dead.") ? "dead letters" : "topic"));
  }));
  if (topics.shown) showTopic(topics.shown);
}

function showTopic(name) {
  const t = topics.list.find((x) => x.name === name);
  topics.shown = t ? name : null;
  $("tp-detail").hidden = !t;
  if (!t) return;
  $("tp-detail-title").textContent = `Queues of ${t.name}`;
  fill($("partitions"), t.partitions.map((p) => el("tr", {},
    td(queueName(p)), td(p.leader === null ? "none" : String(p.leader), "num"),
    td(list((p.replicas || []).map(String))), td(list((p.inSync || []).map(String))),
    td(fmtNum(p.earliestOffset), "num"), td(fmtNum(p.endOffset), "num"))));
}

async function create(ev) {
  ev.preventDefault();
  const out = output("tc-result");
  const name = $("tc-name").value.trim();
  const parts = $("tc-partitions").value.trim(), replicas = $("tc-replicas").value.trim();
  if (!name) return out.fail("Enter the topic's name.");
  if (!/^\d+$/.test(parts) || (replicas && !/^\d+$/.test(replicas))) {
    return out.fail("Queues and replicas are whole numbers.");
  }
  const body = { name, partitions: Number(parts) };
  if (replicas) body.replicationFactor = Number(replicas);
  if (!confirmed(`Create topic ${name} with ${parts} queue(s)?`)) return;
  const r = await act(out, "POST", "/admin/topics", body);
  if (!r) return;
  topics.shown = r.data.name;
  await loadTopics();
  out.ok(`Topic ${r.data.name} created with ${r.data.partitionCount} queue(s).`);
}

export function initTopics() {
  $("topic-form").addEventListener("submit", create);
  $("tp-internal").addEventListener("change", loadTopics);
  $("tp-refresh").addEventListener("click", loadTopics);
}
