// The admin API as the console calls it. The key is kept in sessionStorage (this tab only) and
// sent as a header, never a cookie: another site cannot make this browser act with it.
"use strict";

const KEY = "mqgw.adminKey";

export function key() {
  return sessionStorage.getItem(KEY) || "";
}

export function useKey(k) {
  if (k) sessionStorage.setItem(KEY, k);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

/** One call: {status, data} (data null when the answer is not JSON); a network failure throws. */
export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (key()) headers.Authorization = "Bearer " + key();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  let data = null;
  try {
    data = await r.json();
  } catch (e) {
    data = null;
  }
  return { status: r.status, data };
}

/** The API's error as a line: "409 already_delivered: …". */
export function errorText(r) {
  const e = r.data && r.data.error;
  return e ? `${r.status} ${e.code}: ${e.message}` : `HTTP ${r.status}`;
}

/** A path segment: names are checked by the API, but never trusted to be URL-safe here. */
export const seg = encodeURIComponent;

/** `call` as a form's action: its answer, or an error written to `out` (null then). */
export async function act(out, method, path, body, ok = (s) => s >= 200 && s < 300) {
  try {
    const r = await api(method, path, body);
    if (!ok(r.status)) {
      out.fail(errorText(r));
      return null;
    }
    return r;
  } catch (e) {
    out.fail(`the gateway did not answer: ${e}`);
    return null;
  }
}
