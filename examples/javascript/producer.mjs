// Produce the lines of stdin to a topic, one record per line, up to 100 records per request.
//
//   printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 node producer.mjs demo
//
// Prints where each record went, one JSON line each ({"partition":4,"offset":0}, or {"error":…}
// for a record the broker refused), and exits 1 if any record failed. Node 18+, no dependencies.
// Environment: MQGW_URL (default http://127.0.0.1:8080), MQGW_API_KEY (sent as a bearer token),
// MQGW_PRODUCER (the producer name, needed when a key is bound to several).
import { createInterface } from "node:readline";

const URL = process.env.MQGW_URL ?? "http://127.0.0.1:8080";
const KEY = process.env.MQGW_API_KEY;
const BATCH = 100;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// One request for a batch. A 503 is retried after its Retry-After: a resend may write a record
// twice, which an at-least-once consumer must tolerate anyway.
async function produce(topic, values) {
  const body = { topic, messages: values.map((value) => ({ value })) };
  if (process.env.MQGW_PRODUCER) body.producer = process.env.MQGW_PRODUCER;
  const headers = { "content-type": "application/json" };
  if (KEY) headers.authorization = `Bearer ${KEY}`;
  for (let attempt = 1; ; attempt++) {
    const r = await fetch(`${URL}/produce`, {
      method: "POST", headers, body: JSON.stringify(body), signal: AbortSignal.timeout(30_000),
    });
    if (r.status === 503 && attempt < 5) {
      await sleep(1000 * Number(r.headers.get("retry-after") ?? 1));
      continue;
    }
    if (!r.ok) throw new Error(`produce: ${r.status} ${await r.text()}`);
    return (await r.json()).results;
  }
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
