// Small DOM helpers. Every value from the API goes into the page as text (textContent or a
// text node), never as HTML; the page's Content-Security-Policy would stop markup anyway.
"use strict";

export const $ = (id) => document.getElementById(id);

/** An element with attributes (`text` sets its text, `on<event>` a listener) and children
 * (strings become text nodes). */
export function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") e.textContent = String(v);
    else if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}

export function td(text, cls) {
  return el("td", { text, class: cls });
}

export function button(text, label, onclick) {
  return el("button", { type: "button", text, "aria-label": label, onclick });
}

export function show(node, text) {
  node.textContent = text;
  node.hidden = !text;
}

export function problem(text) {
  show($("problem"), text);
}

/** A form's result line: `ok` and `fail` write it (role=status, so it is read out). */
export function output(id) {
  const node = $(id);
  return {
    ok(text) { node.textContent = text; node.className = "result ok"; },
    fail(text) { node.textContent = text; node.className = "result err"; },
    clear() { node.textContent = ""; node.className = "result"; },
  };
}

/** Ask before an action; false when the operator declines. */
export function confirmed(text) {
  return window.confirm(text);
}

export function fmtAge(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${ms} ms`;
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s} s`;
  const m = Math.round(s / 60);
  return m < 120 ? `${m} min` : `${Math.round(m / 60)} h`;
}

export function fmtNum(n) {
  return n === null || n === undefined ? "–" : n.toLocaleString("en");
}

export function fmtTime(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

export function list(names) {
  return names && names.length ? names.join(", ") : "–";
}

/** Comma- or space-separated names as an array (empty entries dropped). */
export function names(text) {
  return text.split(/[\s,]+/).filter((x) => x);
}

export function sparkline(samples, width = 60, height = 16) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("role", "img");
  const last = samples.length ? samples[samples.length - 1] : 0;
  svg.setAttribute("aria-label", `backlog over the last ${samples.length} refreshes, now ${last}`);
  const max = Math.max(1, ...samples);
  const step = samples.length > 1 ? width / (samples.length - 1) : 0;
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("points", samples.map((v, i) =>
    `${(i * step).toFixed(1)},${(height - 1 - (v / max) * (height - 2)).toFixed(1)}`).join(" "));
  svg.appendChild(line);
  return svg;
}

// Tables drawn anew at each refresh give the keyboard focus back to the control that had it
// (found again by its label), or a keyboard user would be thrown out every 2 s.
export function keepingFocus(draw) {
  const active = document.activeElement;
  const label = active && active.closest("tbody") ? active.getAttribute("aria-label") : null;
  draw();
  if (label) {
    const again = [...document.querySelectorAll("tbody [aria-label]")]
      .find((x) => x.getAttribute("aria-label") === label);
    if (again) again.focus();
  }
}

/** Replace a table body's rows. */
export function fill(table, rows) {
  const body = table.tBodies[0];
  const fresh = document.createDocumentFragment();
  for (const r of rows) fresh.appendChild(r);
  body.replaceChildren(fresh);
}
