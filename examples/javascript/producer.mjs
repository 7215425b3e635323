// Produce the lines of stdin to a topic, one record per line, up to 100 records per request.
//
//   printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 node producer.mjs demo
//
// Prints where each record went, one JSON line each ({"partition":4,"offset":0}, or {"error":…}
// for a record the broker refused), and exits 1 if any record failed. Node 18+, no dependencies.
// Environment: MQGW_URL (default http://127.0.0.1:8080), MQGW_API_KEY (sent as a bearer token),
// MQGW_PRODUCER (the producer name, needed when a key is bound to several).
//
// A gateway that cannot be reached (not started yet, restarting, a network error) or answers
// 502/503/504 is retried until it answers, with capped exponential backoff: 0.5 s, 1 s, 2 s, ...
// up to 10 s between tries, each wait jittered (a random 50-100 %) so that many producers do not
// come back in step; a Retry-After longer than that is honoured. Each retry says why on stderr.
import { createInterface } from "node:readline";

const URL = process.env.MQGW_URL ?? "http://127.0.0.1:8080";
const KEY = process.env.MQGW_API_KEY;
const BATCH = 100;
const FIRST_RETRY_MS = 500;
const MAX_RETRY_MS = 10_000;
const RETRY_STATUSES = [502, 503, 504]; // a proxy without a node behind it; Kafka unreachable; a timeout
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// POST until the gateway gives an answer that is not "try again" (see the top). A resend may
// write a record twice (the first try may have been written before the connection broke), which
// an at-least-once consumer must tolerate anyway.
async function post(path, body) {
  const headers = { "content-type": "application/json" };
  if (KEY) headers.authorization = `Bearer ${KEY}`;
  for (let backoff = FIRST_RETRY_MS; ; backoff = Math.min(backoff * 2, MAX_RETRY_MS)) {
    let wait = 0;
    let why;
    try {
      const r = await fetch(`${URL}${path}`, {
        method: "POST", headers, body: JSON.stringify(body), signal: AbortSignal.timeout(30_000),
      });
      if (!RETRY_STATUSES.includes(r.status)) return r;
      wait = 1000 * (Number(r.headers.get("retry-after")) || 0);
      why = `gateway answered ${r.status}`;
    } catch (e) { // refused, reset, timed out, no such host
      why = `gateway unreachable at ${URL} (${e.cause?.code ?? e.cause ?? e})`;
    }
    wait = Math.max(wait, backoff * (0.5 + Math.random() / 2));
    console.error(`producer: ${why}; retrying in ${(wait / 1000).toFixed(1)} s`);
    await sleep(wait);
  }
}

// One request for a batch, retried while the gateway is away (post).
async function produce(topic, values) {
  const body = { topic, messages: values.map((value) => ({ value })) };
  if (process.env.MQGW_PRODUCER) body.producer = process.env.MQGW_PRODUCER;
  const r = await post("/produce", body);
  if (!r.ok) throw new Error(`produce: ${r.status} ${await r.text()}`);
  return (await r.json()).results;
}

const topic = process.argv[2];
if (!topic) {
  console.error("usage: node producer.mjs TOPIC  (records: the lines of stdin)");
  process.exit(2);
}
const lines = [];
for await (const line of createInterface({ input: process.stdin })) lines.push(line);
let failed = 0;
for (let i = 0; i < lines.length; i += BATCH) {
  for (const result of await produce(topic, lines.slice(i, i + BATCH))) {
    if (result.error) failed++;
    console.log(JSON.stringify(result));
  }
}
process.exitCode = failed ? 1 : 0;
