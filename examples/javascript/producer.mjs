// Produce the lines of stdin to a topic, one record per line, as they come.
//
//   printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 node producer.mjs demo
//   tail -f app.log | node producer.mjs demo
//
// A batch goes out when it holds 100 lines, or MQGW_LINGER_MS (default 200) after its first line
// was read, or when stdin ends; on Ctrl-C (or SIGTERM) the lines read and not yet sent are sent
// before it exits (130, or 143). So a pipe that stays open is sent as it flows.
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
const LINGER_MS = Number(process.env.MQGW_LINGER_MS ?? 200);
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
    for (const end = Date.now() + wait; Date.now() < end; await sleep(Math.min(100, end - Date.now()))) {
      if (stopped) {
        console.error(`producer: stopped while the gateway was away; ${body.messages.length} record(s) of this batch not sent`);
        process.exit(1);
      }
    }
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

let batch = [];
let timer = null;
let sending = Promise.resolve(); // batches go out one after another, in order
let failed = 0;
let stopped = 0; // the signal that asked us to stop

// Send what is in the batch now (after the batches before it).
function flush() {
  clearTimeout(timer);
  timer = null;
  const values = batch;
  batch = [];
  if (values.length === 0) return sending;
  sending = sending.then(async () => {
    for (let i = 0; i < values.length; i += BATCH) {
      for (const result of await produce(topic, values.slice(i, i + BATCH))) {
        if (result.error) failed++;
        console.log(JSON.stringify(result));
      }
    }
  });
  return sending;
}

const input = createInterface({ input: process.stdin });
input.on("line", (line) => {
  batch.push(line);
  if (batch.length >= BATCH) flush();
  else if (timer === null) timer = setTimeout(flush, LINGER_MS);
});
const ended = new Promise((resolve) => input.on("close", resolve));
for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143]]) {
  process.on(signal, async () => {
    stopped = code;
    input.pause();
    await flush();
    process.exit(code);
  });
}
await ended;
await flush();
process.exitCode = failed ? 1 : 0;
