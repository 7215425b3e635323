import java.io.BufferedReader;
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

/**
 * Produce the lines of stdin to a topic, one record per line, up to 100 records per request.
 *
 * <pre>printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 java Producer.java demo</pre>
 *
 * Prints where each record went, one JSON line each ({"partition":4,"offset":0}, or
 * {"error":{...}} for a record the broker refused), and exits 1 if any record failed.
 * Environment: MQGW_URL (default http://127.0.0.1:8080), MQGW_API_KEY (sent as a bearer token),
 * MQGW_PRODUCER (the producer name, needed when a key is bound to several). Java 17+, no
 * dependencies: a small JSON reader is at the end of the file (real code would use Jackson or Gson).
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
            System.err.println("usage: java Producer.java TOPIC  (records: the lines of stdin)");
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

    /** Just enough JSON for this program: objects, arrays, strings, numbers, booleans, null. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        static Object parse(String text) {
            Json j = new Json(text);
            Object v = j.value();
            j.ws();
            if (j.i != text.length()) throw new IllegalArgumentException("trailing data at " + j.i);
            return v;
        }

        static String write(Object v) {
            if (v == null) return "null";
            if (v instanceof Number || v instanceof Boolean) return v.toString();
            if (v instanceof Map<?, ?> m) {
                List<String> fields = new ArrayList<>();
                m.forEach((k, x) -> fields.add(write(k) + ":" + write(x)));
                return "{" + String.join(",", fields) + "}";
            }
            if (v instanceof List<?> l) return "[" + String.join(",", l.stream().map(Json::write).toList()) + "]";
            StringBuilder b = new StringBuilder("\"");
            for (char c : v.toString().toCharArray()) {
                if (c == '"' || c == '\\') b.append('\\').append(c);
                else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                else b.append(c);
            }
            return b.append('"').toString();
        }

        private void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
        }

        private boolean eat(char c) {
            ws();
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        private void expect(char c) {
            if (!eat(c)) throw new IllegalArgumentException("expected '" + c + "' at " + i);
        }

        private Object value() {
            ws();
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                if (eat('}')) return m;
                do {
                    ws();
                    String k = string();
                    expect(':');
                    m.put(k, value());
                } while (eat(','));
                expect('}');
                return m;
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                if (eat(']')) return l;
                do l.add(value()); while (eat(','));
                expect(']');
                return l;
            }
            if (c == '"') return string();
            for (String word : List.of("true", "false", "null")) {
                if (s.startsWith(word, i)) {
                    i += word.length();
                    return word.equals("null") ? null : Boolean.valueOf(word);
                }
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            String n = s.substring(start, i);
            return n.matches("-?\\d+") ? (Object) Long.valueOf(n) : (Object) Double.valueOf(n);
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            for (char c; (c = s.charAt(i++)) != '"'; ) {
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n' -> b.append('\n');
                    case 't' -> b.append('\t');
                    case 'r' -> b.append('\r');
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'u' -> {
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                    }
                    default -> b.append(e); // \" \\ \/
                }
            }
            return b.toString();
        }
    }
}
