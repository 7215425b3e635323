// Apache RocketMQ's own Java client (rocketmq-client 5.5.0, the remoting protocol) on the other side
// of the gateway, for tests/system/test_rocketmq_interop.py: it reads what the gateway wrote and
// writes what the gateway reads. Needs only the jars of gateway/cli/rocketmq_dist.py (fastjson2
// among them).
//
//   javac -cp 'JARS/*' -d OUT RocketInterop.java
//   java -cp 'JARS/*:OUT' RocketInterop NAMESRV < commands
//
// One command a line on stdin, as a JSON object; answers on stdout, one JSON object a line:
//   {"send": TOPIC, "queue": N, "tag": T, "keys": [K, ...], "properties": {NAME: VALUE}, "body": TEXT}
//       a DefaultMQProducer sends it to queue N of broker-a (tag, keys, properties optional; the
//       producer zlib-compresses bodies over 4 KiB, its default) and answers
//       {"sent": TOPIC, "status", "queueId", "offset", "msgId"}
//   {"pull": TOPIC, "queue": N, "offset": O, "count": C}
//       a DefaultMQPullConsumer pulls queue N of broker-a from offset O (subscription "*") until C
//       records or an answer other than FOUND, and answers one line per record, {"topic",
//       "queueId", "offset", "tags", "keys", "uniqKey", "bornTimestamp", "sysFlag", "properties"
//       (the user properties: every name not in MessageConst.STRING_HASH_SET), "body" (UTF-8)},
//       then {"pulled": C', "status": the last PullStatus}
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONObject;
import com.alibaba.fastjson2.JSONWriter;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

@SuppressWarnings("deprecation") // DefaultMQPullConsumer: the client's pull at an explicit offset
public class RocketInterop {
    static final String BROKER = "broker-a";
    static final long TIMEOUT_MS = 15_000;

    static DefaultMQProducer producer;
    static DefaultMQPullConsumer consumer;
    static String namesrv;

    public static void main(String[] args) throws Exception {
        namesrv = args[0];
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            for (String line; (line = in.readLine()) != null; ) {
                if (line.isBlank()) {
                    continue;
                }
                JSONObject cmd = JSON.parseObject(line);
                if (cmd.containsKey("send")) {
                    send(cmd);
                } else if (cmd.containsKey("pull")) {
                    pull(cmd);
                } else {
                    throw new IllegalArgumentException("unknown command: " + line);
                }
                System.out.flush();
            }
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
        // Not shutdown(): the clients' orderly shutdown takes ~3 s (unregistering from the broker,
        // which forgets them by itself), and nothing of theirs is left to flush.
        System.exit(0);
    }

    static void send(JSONObject cmd) throws Exception {
        if (producer == null) {
            producer = new DefaultMQProducer("interop_java_producer");
            producer.setNamesrvAddr(namesrv);
            producer.setInstanceName("interop-producer");
            producer.setSendMsgTimeout((int) TIMEOUT_MS);
            producer.start();
        }
        String topic = cmd.getString("send");
        Message msg = new Message(topic, cmd.getString("body").getBytes(StandardCharsets.UTF_8));
        if (cmd.containsKey("tag")) {
            msg.setTags(cmd.getString("tag"));
        }
        if (cmd.containsKey("keys")) {
            msg.setKeys(cmd.getJSONArray("keys").toJavaList(String.class));
        }
        JSONObject props = cmd.getJSONObject("properties");
        if (props != null) {
            for (String name : props.keySet()) {
                msg.putUserProperty(name, props.getString(name));
            }
        }
        SendResult r = producer.send(msg, new MessageQueue(topic, BROKER, cmd.getIntValue("queue")), TIMEOUT_MS);
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("sent", topic);
        out.put("status", r.getSendStatus().name());
        out.put("queueId", r.getMessageQueue().getQueueId());
        out.put("offset", r.getQueueOffset());
        out.put("msgId", r.getMsgId());
        System.out.println(JSON.toJSONString(out));
    }

    static void pull(JSONObject cmd) throws Exception {
        if (consumer == null) {
            consumer = new DefaultMQPullConsumer("interop_java_reader");
            consumer.setNamesrvAddr(namesrv);
            consumer.setInstanceName("interop-reader");
            consumer.start();
        }
        MessageQueue mq = new MessageQueue(cmd.getString("pull"), BROKER, cmd.getIntValue("queue"));
        long offset = cmd.getLongValue("offset");
        int count = cmd.getIntValue("count");
        List<MessageExt> got = new ArrayList<>();
        PullStatus status = PullStatus.FOUND;
        while (got.size() < count) {
            PullResult r = consumer.pull(mq, "*", offset, Math.min(32, count - got.size()), TIMEOUT_MS);
            status = r.getPullStatus();
            if (status != PullStatus.FOUND) {
                break;
            }
            got.addAll(r.getMsgFoundList());
            offset = r.getNextBeginOffset();
        }
        for (MessageExt m : got) {
            Map<String, String> user = new TreeMap<>();
            m.getProperties().forEach((k, v) -> {
                if (!MessageConst.STRING_HASH_SET.contains(k)) {
                    user.put(k, v);
                }
            });
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("topic", m.getTopic());
            out.put("queueId", m.getQueueId());
            out.put("offset", m.getQueueOffset());
            out.put("tags", m.getTags());
            out.put("keys", m.getKeys());
            out.put("uniqKey", MessageClientIDSetter.getUniqID(m));
            out.put("bornTimestamp", m.getBornTimestamp());
            out.put("sysFlag", m.getSysFlag());
            out.put("properties", user);
            out.put("body", new String(m.getBody(), StandardCharsets.UTF_8));
            System.out.println(JSON.toJSONString(out, JSONWriter.Feature.WriteNulls));
        }
        Map<String, Object> done = new LinkedHashMap<>();
        done.put("pulled", got.size());
        done.put("status", status.name());
        System.out.println(JSON.toJSONString(done));
    }
}
