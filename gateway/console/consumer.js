// One consumer's page: its queues, who holds their locks, its broadcast clients, and the
// backlog trend (from the list's refresh); its settings (settings.js), offset reset
// (reset.js) and dead letters (deadletters.js).
"use strict";

import { api, seg } from "./api.js";
import { consumers, fmtRate, pauseButton, stateOf } from "./consumers.js";
import { loadDeadLetters } from "./deadletters.js";
import { fillTopics, resetFor } from "./reset.js";
import { loadSettings } from "./settings.js";
import { $, el, fill, fmtAge, fmtNum, keepingFocus, output, sparkline, td } from "./ui.js";

const page = {
  name: null, // the consumer shown
  holders: new Map(), // "topic queue" -> lastClientAddress of a held lock (cluster mode)
};

/** Who holds each cluster-mode queue's lock now (GET /consumers/{c}/queues: the backlog
 * listing has no addresses); then draw. A broadcast queue's holder is its clientId. */
export async function refreshConsumer() {
  const name = page.name;
  try {
    const r = await api("GET", `/consumers/${seg(name)}/queues`);
    if (r.status === 200 && page.name === name) {
      page.holders = new Map(r.data.queues.filter((q) => q.locked)
        .map((q) => [`${q.topic} ${q.queue}`, q.lastClientAddress || "unknown address"]));
    }
  } catch (e) {
    // the backlog refresh reports an unreachable gateway; the holders just stay as they were
  }
  drawConsumer();
}

function holder(q) {
  if (q.clientId !== null) return q.lockAgeMs === null ? "–" : q.clientId;
  return page.holders.get(`${q.topic} ${q.queue}`) || "–";
}

/** Open the page of `name`: settings and dead letters are read once (and after each change),
 * queues at every refresh. */
export async function openConsumer(name) {
  if (page.name !== name) {
    page.name = name;
    page.holders = new Map();
    for (const id of ["st-result", "rl-result", "rt-result", "un-result", "dl-result"]) {
      output(id).clear();
    }
    resetFor(name);
  }
  $("consumer-title").textContent = `Consumer ${name}`;
  refreshConsumer();
  await Promise.all([loadSettings(name), loadDeadLetters(name)]);
}

/** The queues, summary and trend, from the latest sample of the list. */
export function drawConsumer() {
  const c = consumers.list.find((x) => x.consumer === page.name);
  const summary = $("consumer-summary");
  if (!c) {
    summary.textContent = "Not in the backlog listing (yet): it has no queues to show.";
    fill($("queues"), []);
    $("consumer-trend").replaceChildren();
    fillTopics(null);
    return;
  }
  const waiting = c.totalBacklog ? `oldest waiting ${fmtAge(c.oldestAgeMs)}` : "nothing waiting";
  summary.textContent = `${c.mode} mode · ${stateOf(c)} · backlog ${fmtNum(c.totalBacklog)} · ` +
    `${waiting} · ${fmtRate(consumers.rate.get(c.consumer))} acknowledged`;
  $("consumer-trend").replaceChildren(sparkline(consumers.trend.get(c.consumer) || [], 160, 32),
    pauseButton(c));
  keepingFocus(() => fill($("queues"), c.queues.map((q) => el("tr", {},
    td(q.topic), td(q.queue), td(q.clientId === null ? "–" : q.clientId),
    td(fmtNum(q.committedOffset), "num"), td(fmtNum(q.maxOffset), "num"),
    td(fmtNum(q.backlog), "num"), td(fmtAge(q.oldestAgeMs), "num"),
    td(fmtAge(q.lockAgeMs), "num"), td(holder(q))))));
  $("clients-part").hidden = !c.clients.length;
  const now = Date.now();
  fill($("clients"), c.clients.map((x) => el("tr", { "data-client": x.clientId },
    td(x.clientId), td(`${fmtAge(Math.max(0, now - x.lastSeenMs))} ago`, "num"),
    td(fmtNum(x.totalBacklog), "num"), td(fmtAge(x.oldestAgeMs), "num"))));
  fillTopics(c);
}

/** The settings changed (or were read): the reset form's topics follow them. */
export function settingsChanged() {
  fillTopics(consumers.list.find((x) => x.consumer === page.name) || null);
}
