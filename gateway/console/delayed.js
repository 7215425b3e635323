// Cancel a delayed record by its delayId (DELETE /delayed/{id}: an admin key may cancel any).
"use strict";

import { act, seg } from "./api.js";
import { $, confirmed, fmtTime, output } from "./ui.js";

async function cancel(ev) {
  ev.preventDefault();
  const out = output("dy-result");
  const id = $("dy-id").value.trim();
  const producer = $("dy-producer").value.trim();
  if (!id) return out.fail("Enter the delayId that /produce answered for the record.");
  if (!confirmed("Cancel this delayed record? It will never be written to its topic.")) return;
  const q = producer ? `?producer=${seg(producer)}` : "";
  const r = await act(out, "DELETE", `/delayed/${seg(id)}${q}`);
  if (!r) return;
  const due = `the record for ${r.data.topic}, due ${fmtTime(r.data.deliverAt)}`;
  out.ok(r.data.alreadyCancelled ? `Already cancelled before: ${due}; nothing changed.` :
    `Cancelled: ${due}, will not be delivered.`);
}

export function initDelayed() {
  $("delayed-form").addEventListener("submit", cancel);
}
