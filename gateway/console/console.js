// The operations console (gateway/api/console.py serves it): a page over the admin API, no
// build step, no library: ES modules of our own, one per view. This one holds the key form,
// the views (the URL's #fragment: #consumers, #consumer/<name>, #topics, #access, #delayed,
// #report) and the 2 s refresh of the consumers' backlog.
"use strict";

import { api, errorText, forgetKey, key, seg, useKey } from "./api.js";
import { initAccess, loadAccess } from "./access.js";
import { openConsumer, refreshConsumer, settingsChanged } from "./consumer.js";
import { drawConsumers, initConsumers, listing, loadAlerts, sample } from "./consumers.js";
import { initDeadLetters } from "./deadletters.js";
import { initDelayed } from "./delayed.js";
import { initReset } from "./reset.js";
import { initSettings } from "./settings.js";
import { initTopics, loadTopics } from "./topics.js";
import { $, problem, show } from "./ui.js";

const REFRESH_MS = 2000;
const VIEWS = ["consumers", "consumer", "topics", "access", "delayed", "report"];
let busy = false;
let view = "consumers";
let shown = ""; // the consumer of the "consumer" view

/** Read the backlog of every consumer and draw the list; on a consumer's page, only that
 * consumer's (the listing of every consumer is the costly admin call). */
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const one = view === "consumer" ? shown : "";
    const r = await api("GET", one ? `/admin/backlog?consumer=${seg(one)}` : "/admin/backlog");
    if (r.status === 401 || r.status === 403) {
      listing.refused = key() ? "The key was refused: enter an admin key above to see the consumers." :
        "Enter an admin key above to see the consumers.";
      sample([]);
      redraw();
      problem(key() ? `The key was refused (${errorText(r)}).` :
        "This gateway needs an admin key: enter one above.");
      show($("banner"), "");
      if (!key()) $("key").focus();
      return;
    }
    if (r.status !== 200) {
      problem(`The admin API answered ${errorText(r)}.`);
      return;
    }
    const d = r.data;
    // During a broker outage the figures are the last ones a node read: say so, and why.
    problem(d.stale ? `The backlog figures are ${Math.round((d.watermarksAgeMs || 0) / 1000)} s old: ` +
      `the broker is not answering (${d.staleReason}). They refresh once it answers again.` : "");
    listing.refused = "";
    show($("banner"), key() ? "" :
      "Auth is off on this gateway: anyone who reaches it can use the admin API and this console.");
    sample(r.data.consumers, !!one);
    $("refreshed").textContent = d.stale ?
      `stale: figures from ${new Date(Date.now() - (d.watermarksAgeMs || 0)).toLocaleTimeString("en-GB")}` :
      `updated ${new Date().toLocaleTimeString("en-GB")}`;
    redraw();
  } catch (e) {
    problem(`The gateway did not answer: ${e}`);
  } finally {
    busy = false;
  }
}

function redraw() {
  if (view === "consumers") drawConsumers();
  if (view === "consumer") refreshConsumer();
}

/** Show the view the URL names, and load what it shows. */
async function route() {
  let hash = "";
  try {
    hash = decodeURIComponent(location.hash.slice(1));
  } catch (e) {
    hash = ""; // a mangled link (a stray %): the consumers, not a broken page
  }
  const [name, ...rest] = hash.split("/");
  view = VIEWS.includes(name) ? name : "consumers";
  if (view === "consumer" && !rest.length) view = "consumers";
  for (const v of VIEWS) $(`view-${v}`).hidden = v !== view;
  for (const a of document.querySelectorAll("nav a")) {
    const here = a.dataset.view === view || (view === "consumer" && a.dataset.view === "consumers");
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const title = document.querySelector(`#view-${view} h2`);
  if (document.activeElement && document.activeElement.closest("nav")) title.focus();
  shown = view === "consumer" ? rest.join("/") : "";
  if (view === "consumer") await openConsumer(shown);
  else if (view === "consumers") {
    drawConsumers();
    await Promise.all([refresh(), loadAlerts()]); // the list may hold one consumer's sample only
  }
  else if (view === "topics") await loadTopics();
  else if (view === "access") await loadAccess();
}

function initReport() {
  const url = document.querySelector('meta[name="mqgw-report-url"]').content;
  $("report-link").hidden = !url;
  $("report-howto").hidden = !!url;
  if (url) {
    $("report-href").href = url;
    $("report-where").textContent = url;
  }
}

function init() {
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    useKey($("key").value.trim());
    $("key").value = "";
    refresh().then(route);
  });
  $("key-forget").addEventListener("click", () => {
    forgetKey();
    refresh();
  });
  initConsumers(refresh);
  initSettings(settingsChanged);
  initReset();
  initDeadLetters();
  initTopics();
  initAccess();
  initDelayed();
  initReport();
  window.addEventListener("hashchange", route);
  refresh().then(route);
  setInterval(() => {
    if (view === "consumers" || view === "consumer") refresh();
  }, REFRESH_MS);
}

init();
