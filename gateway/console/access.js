// API keys and producers: list (never a secret), create a key (its secret shown once), revoke
// a key; register, replace and unregister a producer.
"use strict";

import { act, seg } from "./api.js";
import { $, button, confirmed, el, fill, fmtTime, list, names, output, td } from "./ui.js";

export async function loadAccess() {
  const out = output("kc-result");
  const [keys, producers] = await Promise.all([
    act(out, "GET", "/admin/keys"), act(output("pr-result"), "GET", "/admin/producers")]);
  if (keys) {
    fill($("keys"), keys.data.keys.map((k) => el("tr", { "data-key": k.id },
      td(k.name), td(k.id, "raw"), td(k.admin ? "yes" : "no"), td(list(k.producers)),
      td(list(k.consumers)), td(fmtTime(k.createdMs)),
      el("td", {}, button("Revoke", `Revoke key ${k.name} (${k.id})`, () => revoke(k))))));
  }
  if (producers) {
    const rows = producers.data.producers;
    fill($("producers"), rows.map((p) => el("tr", { "data-producer": p.producer },
      td(p.producer), td(list(p.topics)), td(fmtTime(p.updatedMs)),
      el("td", {}, button("Unregister", `Unregister producer ${p.producer}`,
        () => unregister(p.producer))))));
  }
}

async function revoke(k) {
  if (!confirmed(`Revoke key ${k.name} (${k.id})? It stops working on every node at once.`)) return;
  const out = output("kc-result");
  if (await act(out, "DELETE", `/admin/keys/${seg(k.id)}`)) {
    out.ok(`Key ${k.name} (${k.id}) revoked.`);
    await loadAccess();
  }
}

async function create(ev) {
  ev.preventDefault();
  const out = output("kc-result");
  const body = { name: $("kc-name").value.trim(), admin: $("kc-admin").checked,
    producers: names($("kc-producers").value), consumers: names($("kc-consumers").value) };
  const grants = [body.admin ? "admin" : "", ...body.producers.map((p) => `producer ${p}`),
    ...body.consumers.map((c) => `consumer ${c}`)].filter((x) => x);
  if (!confirmed(`Create key ${body.name || "(no name)"} for ${grants.join(", ") || "nothing"}?`)) {
    return;
  }
  const r = await act(out, "POST", "/admin/keys", body);
  if (!r) return;
  out.ok(`Key ${r.data.name} (${r.data.id}) created.`);
  $("kc-key").value = r.data.key;
  $("kc-secret").hidden = false;
  $("kc-key").focus();
  $("kc-key").select();
  for (const id of ["kc-name", "kc-producers", "kc-consumers"]) $(id).value = "";
  $("kc-admin").checked = false;
  await loadAccess();
}

async function register(ev) {
  ev.preventDefault();
  const out = output("pr-result");
  const name = $("pr-name").value.trim();
  const topics = names($("pr-topics").value);
  if (!name) return out.fail("Enter the producer's name.");
  if (!confirmed(`Register producer ${name} for ${list(topics)}? (replaces its topics if it ` +
      "is registered)")) return;
  const r = await act(out, "PUT", `/admin/producers/${seg(name)}`, { topics });
  if (!r) return;
  out.ok(`Producer ${name} may produce to ${list(r.data.topics)}.`);
  await loadAccess();
}

async function unregister(name) {
  if (!confirmed(`Unregister producer ${name}? It may no longer produce (unless in open mode).`)) {
    return;
  }
  const out = output("pr-result");
  if (await act(out, "DELETE", `/admin/producers/${seg(name)}`)) {
    out.ok(`Producer ${name} unregistered.`);
    await loadAccess();
  }
}

export function initAccess() {
  $("key-create").addEventListener("submit", create);
  $("producer-form").addEventListener("submit", register);
  $("kc-done").addEventListener("click", () => {
    $("kc-key").value = "";
    $("kc-secret").hidden = true;
  });
}
