// A consumer loop: fetch a batch, handle it, ack it with the next fetch.
//
//   MQGW_URL=http://127.0.0.1:8080 node consumer.mjs orders-svc demo
//
// - Long poll: each fetch waits up to MQGW_WAIT_MS (default 10000) for records.
// - Piggy-backed ack: the requestId of the handled batch rides on the next fetch.
// - 429 (consumer rate limit): wait retryAfterMs; 503: wait Retry-After seconds.
// - A handler that throws hands the batch back with /unlock: it is fetched again at once.
// - SIGTERM or Ctrl-C: the current fetch finishes, the handled batch is acked and an unhandled
//   one unlocked, and the process exits 0.
// Environment: MQGW_URL, MQGW_API_KEY (bearer token), MQGW_CLIENT_ID (broadcast mode: every
// clientId gets every record), MQGW_FAIL_ONCE (a value whose first handling throws, to watch the
// unlock). Each handled record is printed as one JSON line. Node 18+, no dependencies.
const URL = process.env.MQGW_URL ?? "http://127.0.0.1:8080";
const KEY = process.env.MQGW_API_KEY;
const WAIT_MS = Number(process.env.MQGW_WAIT_MS ?? 10000);
const FAIL_ONCE = process.env.MQGW_FAIL_ONCE;
const headers = { "content-type": "application/json", ...(KEY && { authorization: `Bearer ${KEY}` }) };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let stopping = false;
process.on("SIGTERM", () => { stopping = true; });
process.on("SIGINT", () => { stopping = true; });

const failedOnce = new Set();
// The application's work. Delivery is at-least-once, so this must tolerate a record twice.
function handle(queue, message) {
  if (message.value === FAIL_ONCE && !failedOnce.has(message.value)) {
    failedOnce.add(message.value);
    throw new Error(`cannot handle ${message.value} (MQGW_FAIL_ONCE)`);
  }
  const { offset, key, value } = message;
  console.log(JSON.stringify({ queue, offset, key, value }));
}

function post(path, body, timeoutMs = 30_000) {
  return fetch(`${URL}${path}`, {
    method: "POST", headers, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs),
  });
}

// Hand a batch back. If this fails, the lock simply expires after its timeout.
async function unlock(requestId) {
  try { await post("/unlock", { requestId }); } catch (e) { console.error(`unlock failed: ${e}`); }
}

async function main(consumer, topic) {
  const params = { consumer, topic, wait_ms: WAIT_MS };
  if (process.env.MQGW_CLIENT_ID) params.clientId = process.env.MQGW_CLIENT_ID;
  let pending = ""; // requestId of the handled batch, acked by the next fetch
  while (!stopping) {
    let r;
    try {
      r = await post("/message", pending ? { ...params, requestId: pending } : params, WAIT_MS + 30_000);
    } catch (e) {
      console.error(`gateway unreachable (${e.cause ?? e}); retrying in 1 s`);
      await sleep(1000);
      continue;
    }
    if (r.status === 503) { // the ack may not have run: keep it pending
      await sleep(1000 * Number(r.headers.get("retry-after") ?? 1));
      continue;
    }
    if (r.status !== 200 && r.status !== 429) {
      console.error(`${r.status} ${await r.text()}`);
      return 1;
    }
    const body = await r.json();
    pending = ""; // the piggy-backed ack ran, whatever came back
    if (body.ack && !["committed", "already_committed"].includes(body.ack.result)) {
      console.error(`ack: ${body.ack.result}: the batch will be redelivered`);
    }
    if (r.status === 429) { await sleep(body.retryAfterMs); continue; }
    if (body.status === "paused") { await sleep(1000); continue; } // answered at once
    if (body.status !== "ok") continue; // empty: the long poll ran out
    if (stopping) { await unlock(body.requestId); break; } // fetched, not handled: give it back
    try {
      for (const message of body.messages) handle(body.queue, message);
    } catch (e) {
      console.error(`handler failed (${e.message}); batch unlocked`);
      await unlock(body.requestId);
      continue;
    }
    pending = body.requestId;
  }
  if (pending) await post("/ack", { requestId: pending });
  return 0;
}

const [consumer, topic] = process.argv.slice(2);
if (!consumer || !topic) {
  console.error("usage: node consumer.mjs CONSUMER TOPIC");
  process.exit(2);
}
process.exitCode = await main(consumer, topic);
