import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Just enough JSON for the examples: objects, arrays, strings, numbers, booleans, null. Shared by
 * Producer and Consumer; real code would use Jackson or Gson.
 */
final class Json {
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
