import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Produce the lines of stdin to a topic, one record per line, up to 100 records per request.
 *
 * <pre>printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 java -cp out Producer demo</pre> (after javac -d out *.java)
 *
 * Prints where each record went, one JSON line each ({"partition":4,"offset":0}, or
 * {"error":{...}} for a record the broker refused), and exits 1 if any record failed.
 * Environment: MQGW_URL (default http://127.0.0.1:8080), MQGW_API_KEY (sent as a bearer token),
 * MQGW_PRODUCER (the producer name, needed when a key is bound to several). Java 17+, no
 * dependencies: a small JSON reader is in Json.java (real code would use Jackson or Gson).
 */
public class Producer {
    static final String URL = System.getenv().getOrDefault("MQGW_URL", "http://127.0.0.1:8080");
    static final String KEY = System.getenv("MQGW_API_KEY");
    static final int BATCH = 100;
    // The default client prefers HTTP/2: on http:// it offers an h2c upgrade, which the gateway
    // declines, and the connection goes on as HTTP/1.1.
    static final HttpClient http = HttpClient.newHttpClient();

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: java -cp out Producer TOPIC  (records: the lines of stdin)");
            System.exit(2);
        }
        List<String> lines = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))
                .lines().toList();
        int failed = 0;
        for (int i = 0; i < lines.size(); i += BATCH) {
            for (Object result : produce(args[0], lines.subList(i, Math.min(i + BATCH, lines.size())))) {
                if (((Map<?, ?>) result).containsKey("error")) failed++;
                System.out.println(Json.write(result));
            }
        }
        System.exit(failed > 0 ? 1 : 0);
    }

    /**
     * One request for a batch. A 503 is retried after its Retry-After: a resend may write a
     * record twice, which an at-least-once consumer must tolerate anyway.
     */
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
        for (int attempt = 1; ; attempt++) {
            HttpResponse<String> r = http.send(request.build(), HttpResponse.BodyHandlers.ofString());
            if (r.statusCode() == 503 && attempt < 5) {
                Thread.sleep(1000 * Long.parseLong(r.headers().firstValue("retry-after").orElse("1")));
                continue;
            }
            if (r.statusCode() != 200) throw new IllegalStateException("produce: " + r.statusCode() + " " + r.body());
            return (List<?>) ((Map<?, ?>) Json.parse(r.body())).get("results");
        }
    }
}
