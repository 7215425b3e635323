import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;

/**
 * Produce the lines of stdin to a topic, one record per line, as they come.
 *
 * <pre>printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 java -cp out Producer demo
 * tail -f app.log | java -cp out Producer demo</pre> (after javac -d out *.java)
 *
 * A batch goes out when it holds 100 lines, or MQGW_LINGER_MS (default 200) after its first line
 * was read, or when stdin ends; on Ctrl-C (or SIGTERM) the lines read and not yet sent are sent
 * before it exits (130, or 143). So a pipe that stays open is sent as it flows.
 *
 * Prints where each record went, one JSON line each ({"partition":4,"offset":0}, or
 * {"error":{...}} for a record the broker refused), and exits 1 if any record failed.
 * Environment: MQGW_URL (default http://127.0.0.1:8080), MQGW_API_KEY (sent as a bearer token),
 * MQGW_PRODUCER (the producer name, needed when a key is bound to several). Java 17+, no
 * dependencies: a small JSON reader is in Json.java (real code would use Jackson or Gson).
 *
 * A gateway that cannot be reached (not started yet, restarting, a network error) or answers
 * 502/503/504 is retried until it answers, with capped exponential backoff: 0.5 s, 1 s, 2 s, ...
 * up to 10 s between tries, each wait jittered (a random 50-100 %) so that many producers do not
 * come back in step; a Retry-After longer than that is honoured. Each retry says why on stderr.
 */
public class Producer {
    static final String URL = System.getenv().getOrDefault("MQGW_URL", "http://127.0.0.1:8080");
    static final String KEY = System.getenv("MQGW_API_KEY");
    static final int BATCH = 100;
    static final long LINGER_MS = Long.parseLong(System.getenv().getOrDefault("MQGW_LINGER_MS", "200"));
    /** The reader's mark for the end of stdin (compared by identity). */
    static final String EOF = new String("");
    /** Set by the shutdown hook on Ctrl-C or SIGTERM; the main loop then sends what it read. */
    static volatile boolean stopping = false;
    static final CountDownLatch finished = new CountDownLatch(1);
    static final long FIRST_RETRY_MS = 500, MAX_RETRY_MS = 10_000;
    // The default client prefers HTTP/2: on http:// it offers an h2c upgrade, which the gateway
    // declines, and the connection goes on as HTTP/1.1.
    static final HttpClient http = HttpClient.newHttpClient();

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: java -cp out Producer TOPIC  (records: the lines of stdin)");
            System.exit(2);
        }
        BlockingQueue<String> lines = new LinkedBlockingQueue<>();
        Thread reader = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                for (String line; (line = in.readLine()) != null; ) lines.add(line);
            } catch (IOException e) {
                System.err.println("producer: reading stdin: " + e);
            }
            lines.add(EOF);
        });
        reader.setDaemon(true);
        reader.start();
        // On a signal the JVM runs its shutdown hooks and then exits (130 or 143): this one waits
        // until the loop below has sent what it read.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping = true;
            try {
                finished.await(60, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        int failed = 0;
        try {
            List<String> batch = new ArrayList<>();
            long due = 0; // when the batch must go: LINGER_MS after its first line
            for (boolean over = false; !over; ) {
                long now = System.currentTimeMillis();
                String line = lines.poll(batch.isEmpty() ? 100 : Math.min(100, Math.max(0, due - now)),
                        TimeUnit.MILLISECONDS);
                boolean ended = line == EOF;
                if (line != null && !ended) {
                    if (batch.isEmpty()) due = System.currentTimeMillis() + LINGER_MS;
                    batch.add(line);
                }
                if (stopping) { // what the reader already passed on
                    for (String l; (l = lines.poll()) != null; ) {
                        if (l == EOF) ended = true;
                        else batch.add(l);
                    }
                }
                over = ended || stopping;
                if (!batch.isEmpty() && (over || batch.size() >= BATCH || System.currentTimeMillis() >= due)) {
                    for (int i = 0; i < batch.size(); i += BATCH) {
                        for (Object result : produce(args[0], batch.subList(i, Math.min(i + BATCH, batch.size())))) {
                            if (((Map<?, ?>) result).containsKey("error")) failed++;
                            System.out.println(Json.write(result));
                        }
                    }
                    System.out.flush();
                    batch.clear();
                }
            }
        } catch (IllegalStateException e) {
            System.err.println("producer: " + e.getMessage());
            failed++;
        } finally {
            finished.countDown();
        }
        if (!stopping) System.exit(failed > 0 ? 1 : 0);
        // stopping: returning lets the shutdown hook end, and the JVM exits as the signal asks
    }

    /**
     * Send until the gateway gives an answer that is not "try again" (see the class comment). A
     * resend may write a record twice (the first try may have been written before the connection
     * broke), which an at-least-once consumer must tolerate anyway.
     */
    static HttpResponse<String> send(HttpRequest request) throws InterruptedException {
        for (long backoff = FIRST_RETRY_MS; ; backoff = Math.min(backoff * 2, MAX_RETRY_MS)) {
            long waitMs = 0;
            String why;
            try {
                HttpResponse<String> r = http.send(request, HttpResponse.BodyHandlers.ofString());
                int status = r.statusCode();
                if (status != 502 && status != 503 && status != 504) return r;
                try {
                    waitMs = 1000 * Long.parseLong(r.headers().firstValue("retry-after").orElse("0"));
                } catch (NumberFormatException e) {
                    waitMs = 0; // an HTTP date: use the backoff
                }
                why = "gateway answered " + status;
            } catch (IOException e) { // refused, reset, timed out, no such host
                why = "gateway unreachable at " + URL + " (" + e + ")";
            }
            waitMs = Math.max(waitMs, (long) (backoff * ThreadLocalRandom.current().nextDouble(0.5, 1.0)));
            System.err.printf("producer: %s; retrying in %.1f s%n", why, waitMs / 1000.0);
            for (long end = System.currentTimeMillis() + waitMs; System.currentTimeMillis() < end; Thread.sleep(100)) {
                if (stopping) throw new IllegalStateException("stopped while the gateway was away; this batch was not sent");
            }
        }
    }

    /** One request for a batch, retried while the gateway is away ({@link #send}). */
    static List<?> produce(String topic, List<String> values) throws Exception {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("topic", topic);
        body.put("messages", values.stream().map(v -> Map.of("value", v)).toList());
        if (System.getenv("MQGW_PRODUCER") != null) body.put("producer", System.getenv("MQGW_PRODUCER"));
        HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(URL + "/produce"))
                .timeout(Duration.ofSeconds(30))
                .header("content-type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(Json.write(body)));
        if (KEY != null) request.header("authorization", "Bearer " + KEY);
        HttpResponse<String> r = send(request.build());
        if (r.statusCode() != 200) throw new IllegalStateException("produce: " + r.statusCode() + " " + r.body());
        return (List<?>) ((Map<?, ?>) Json.parse(r.body())).get("results");
    }
}
