import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;

/**
 * A consumer loop: fetch a batch, handle it, ack it with the next fetch.
 *
 * <pre>MQGW_URL=http://127.0.0.1:8080 java -cp out Consumer orders-svc demo</pre> (after javac -d out *.java)
 *
 * <ul>
 * <li>Long poll: each fetch waits up to MQGW_WAIT_MS (default 10000) for records.
 * <li>Piggy-backed ack: the requestId of the handled batch rides on the next fetch.
 * <li>429 (consumer rate limit): wait retryAfterMs; 503: wait Retry-After seconds.
 * <li>A handler that throws hands the batch back with /unlock: it is fetched again at once.
 * <li>SIGTERM or Ctrl-C: the current fetch finishes, the handled batch is acked and an unhandled
 *     one unlocked, and the JVM exits 0.
 * </ul>
 * Environment: MQGW_URL, MQGW_API_KEY (bearer token), MQGW_CLIENT_ID (broadcast mode: every
 * clientId gets every record), MQGW_FAIL_ONCE (a value whose first handling throws, to watch the
 * unlock). Each handled record is printed as one JSON line. Java 17+, no dependencies: a small
 * JSON reader is in Json.java (real code would use Jackson or Gson).
 */
public class Consumer {
    static final String URL = System.getenv().getOrDefault("MQGW_URL", "http://127.0.0.1:8080");
    static final String KEY = System.getenv("MQGW_API_KEY");
    static final int WAIT_MS = Integer.parseInt(System.getenv().getOrDefault("MQGW_WAIT_MS", "10000"));
    static final String FAIL_ONCE = System.getenv("MQGW_FAIL_ONCE");

    // The default client prefers HTTP/2: on http:// it offers an h2c upgrade, which the gateway
    // declines, and the connection goes on as HTTP/1.1.
    static final HttpClient http = HttpClient.newHttpClient();
    static final Set<String> failedOnce = new HashSet<>();
    static volatile boolean stopping;

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: java -cp out Consumer CONSUMER TOPIC");
            System.exit(2);
        }
        CountDownLatch stopped = new CountDownLatch(1);
        int[] exitCode = {1};
        // On SIGTERM the JVM runs its shutdown hooks and then exits: this one lets the loop finish
        // (its ack included) first, then exits with the loop's code instead of 143.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping = true;
            try {
                stopped.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            System.out.flush();
            Runtime.getRuntime().halt(exitCode[0]);
        }));
        try {
            exitCode[0] = run(args[0], args[1]);
        } finally {
            stopped.countDown();
        }
        System.exit(exitCode[0]);
    }

    static int run(String consumer, String topic) throws Exception {
        Map<String, Object> params = new LinkedHashMap<>();
        params.put("consumer", consumer);
        params.put("topic", topic);
        params.put("wait_ms", WAIT_MS);
        if (System.getenv("MQGW_CLIENT_ID") != null) params.put("clientId", System.getenv("MQGW_CLIENT_ID"));
        String pending = null; // requestId of the handled batch, acked by the next fetch
        while (!stopping) {
            if (pending != null) params.put("requestId", pending);
            else params.remove("requestId");
            HttpResponse<String> r;
            try {
                r = post("/message", params, WAIT_MS + 30_000);
            } catch (IOException e) {
                System.err.println("gateway unreachable (" + e + "); retrying in 1 s");
                Thread.sleep(1000);
                continue;
            }
            if (r.statusCode() == 503) { // the ack may not have run: keep it pending
                Thread.sleep(1000 * Long.parseLong(r.headers().firstValue("retry-after").orElse("1")));
                continue;
            }
            if (r.statusCode() != 200 && r.statusCode() != 429) {
                System.err.println(r.statusCode() + " " + r.body());
                return 1;
            }
            Map<?, ?> body = (Map<?, ?>) Json.parse(r.body());
            pending = null; // the piggy-backed ack ran, whatever came back
            if (body.get("ack") instanceof Map<?, ?> ack
                    && !List.of("committed", "already_committed").contains(ack.get("result"))) {
                System.err.println("ack: " + ack.get("result") + ": the batch will be redelivered");
            }
            if (r.statusCode() == 429) {
                Thread.sleep(((Number) body.get("retryAfterMs")).longValue());
                continue;
            }
            if ("paused".equals(body.get("status"))) { // answered at once, not long-polled
                Thread.sleep(1000);
                continue;
            }
            if (!"ok".equals(body.get("status"))) continue; // empty: the long poll ran out
            String requestId = (String) body.get("requestId");
            if (stopping) { // fetched but not handled: let another client have it now
                unlock(requestId);
                break;
            }
            try {
                for (Object message : (List<?>) body.get("messages")) {
                    handle((String) body.get("queue"), (Map<?, ?>) message);
                }
            } catch (RuntimeException e) {
                System.err.println("handler failed (" + e.getMessage() + "); batch unlocked");
                unlock(requestId);
                continue;
            }
            pending = requestId;
        }
        if (pending != null) post("/ack", Map.of("requestId", pending), 30_000);
        return 0;
    }

    /** The application's work. Delivery is at-least-once, so this must tolerate a record twice. */
    static void handle(String queue, Map<?, ?> message) {
        Object value = message.get("value");
        if (value != null && value.equals(FAIL_ONCE) && failedOnce.add(FAIL_ONCE)) {
            throw new IllegalStateException("cannot handle " + value + " (MQGW_FAIL_ONCE)");
        }
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("queue", queue);
        line.put("offset", message.get("offset"));
        line.put("key", message.get("key"));
        line.put("value", value);
        System.out.println(Json.write(line));
    }

    /** Hand a batch back. If this fails, the lock simply expires after its timeout. */
    static void unlock(String requestId) throws InterruptedException {
        try {
            post("/unlock", Map.of("requestId", requestId), 30_000);
        } catch (IOException e) {
            System.err.println("unlock failed (" + e + "); the batch comes back after the lock timeout");
        }
    }

    static HttpResponse<String> post(String path, Map<String, Object> body, int timeoutMs)
            throws IOException, InterruptedException {
        HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(URL + path))
                .timeout(Duration.ofMillis(timeoutMs))
                .header("content-type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(Json.write(body)));
        if (KEY != null) request.header("authorization", "Bearer " + KEY);
        return http.send(request.build(), HttpResponse.BodyHandlers.ofString());
    }
}
