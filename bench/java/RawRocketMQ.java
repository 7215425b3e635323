// The raw ceiling on Apache RocketMQ with Apache's own Java client (rocketmq-client 5.5.0, the
// remoting protocol), for bench/rawrocketmq.py: the counterpart of bench/rawkafka.py's
// confluent-kafka figures. Compiled against the jars of gateway/cli/rocketmq_dist.py.
//
//   javac -cp 'JARS/*' -d OUT RawRocketMQ.java
//   java -cp 'JARS/*:OUT' RawRocketMQ produce NAMESRV TOPIC COUNT VALUE_SIZE BATCH THREADS MAX_SECONDS
//   java -cp 'JARS/*:OUT' RawRocketMQ consume NAMESRV TOPIC EXPECTED PULL THREADS MAX_SECONDS
//
// produce: a DefaultMQProducer; THREADS threads each send batches of BATCH keyed records of
//   VALUE_SIZE bytes to one queue at a time (send(Collection<Message>, MessageQueue), synchronous),
//   the queues taken in turn, until COUNT records or MAX_SECONDS.
// consume: a DefaultMQPullConsumer; THREADS threads share the queues, each pulls its queues from
//   offset 0, PULL records a pull (the broker gives at most 32), until EXPECTED records in all or
//   MAX_SECONDS.
// Both connect and warm up (one send per queue / the queues' list) before the clock starts, and
// print one JSON line: {"records", "seconds", "records_per_s", "errors"}.
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

@SuppressWarnings("deprecation") // DefaultMQPullConsumer: the client's pull at an explicit offset
public class RawRocketMQ {
    static final int TIMEOUT_MS = 15_000;

    public static void main(String[] args) throws Exception {
        String json = args[0].equals("produce") ? produce(args) : consume(args);
        System.out.println(json);
        System.out.flush();
        System.exit(0); // the clients' orderly shutdown takes seconds and measures nothing
    }

    static byte[] value(long seq, int size) {
        String head = String.format("v%010d-", seq);
        StringBuilder b = new StringBuilder(size).append(head);
        while (b.length() < size) {
            b.append('x');
        }
        return b.toString().getBytes(StandardCharsets.US_ASCII);
    }

    static String produce(String[] a) throws Exception {
        String namesrv = a[1], topic = a[2];
        long count = Long.parseLong(a[3]);
        int size = Integer.parseInt(a[4]), batch = Integer.parseInt(a[5]), threads = Integer.parseInt(a[6]);
        double maxSeconds = Double.parseDouble(a[7]);
        DefaultMQProducer p = new DefaultMQProducer("bench_raw_java");
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("bench-raw-producer");
        p.setSendMsgTimeout(TIMEOUT_MS);
        p.start();
        List<MessageQueue> queues = p.fetchPublishMessageQueues(topic);
        byte[][] values = new byte[1024][];
        for (int i = 0; i < values.length; i++) {
            values[i] = value(i, size);
        }
        for (MessageQueue mq : queues) { // connect and learn the route before the clock starts
            p.send(new Message(topic, "", "k0", values[0]), mq, TIMEOUT_MS);
        }
        AtomicLong next = new AtomicLong();
        AtomicLong sent = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        long t0 = System.nanoTime();
        long deadline = t0 + (long) (maxSeconds * 1e9);
        List<Thread> ts = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread th = new Thread(() -> {
                while (true) {
                    long n = next.getAndIncrement();
                    if (n * batch >= count || System.nanoTime() > deadline) {
                        return;
                    }
                    List<Message> msgs = new ArrayList<>(batch);
                    for (int j = 0; j < batch; j++) {
                        long seq = n * batch + j;
                        msgs.add(new Message(topic, "", "k" + (seq & 1023), values[(int) (seq & 1023)]));
                    }
                    try {
                        SendResult r = p.send(msgs, queues.get((int) (n % queues.size())), TIMEOUT_MS);
                        if (r.getSendStatus() == SendStatus.SEND_OK) {
                            sent.addAndGet(batch);
                        } else {
                            errors.addAndGet(batch);
                        }
                    } catch (Exception e) {
                        errors.addAndGet(batch);
                    }
                }
            });
            th.start();
            ts.add(th);
        }
        for (Thread th : ts) {
            th.join();
        }
        double s = (System.nanoTime() - t0) / 1e9;
        return String.format("{\"records\": %d, \"seconds\": %.3f, \"records_per_s\": %.1f, \"errors\": %d, "
                + "\"total_in_topic\": %d}", sent.get(), s, sent.get() / s, errors.get(),
                sent.get() + queues.size());
    }

    static String consume(String[] a) throws Exception {
        String namesrv = a[1], topic = a[2];
        long expected = Long.parseLong(a[3]);
        int pull = Integer.parseInt(a[4]), threads = Integer.parseInt(a[5]);
        double maxSeconds = Double.parseDouble(a[6]);
        DefaultMQPullConsumer c = new DefaultMQPullConsumer("bench_raw_java_reader");
        c.setNamesrvAddr(namesrv);
        c.setInstanceName("bench-raw-reader");
        c.start();
        List<MessageQueue> queues = new ArrayList<>(c.fetchSubscribeMessageQueues(topic));
        queues.sort(null);
        AtomicLong got = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        long t0 = System.nanoTime();
        long deadline = t0 + (long) (maxSeconds * 1e9);
        List<Thread> ts = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            List<MessageQueue> mine = new ArrayList<>();
            for (int i = t; i < queues.size(); i += threads) {
                mine.add(queues.get(i));
            }
            Thread th = new Thread(() -> {
                long[] offsets = new long[mine.size()];
                boolean[] done = new boolean[mine.size()];
                int left = mine.size();
                while (left > 0 && got.get() < expected && System.nanoTime() < deadline) {
                    for (int i = 0; i < mine.size(); i++) {
                        if (done[i]) {
                            continue;
                        }
                        try {
                            PullResult r = c.pull(mine.get(i), "*", offsets[i], pull, TIMEOUT_MS);
                            if (r.getPullStatus() == PullStatus.FOUND) {
                                got.addAndGet(r.getMsgFoundList().size());
                                offsets[i] = r.getNextBeginOffset();
                            } else {
                                done[i] = true;
                                left--;
                            }
                        } catch (Exception e) {
                            errors.incrementAndGet();
                        }
                    }
                }
            });
            th.start();
            ts.add(th);
        }
        for (Thread th : ts) {
            th.join();
        }
        double s = (System.nanoTime() - t0) / 1e9;
        return String.format("{\"records\": %d, \"seconds\": %.3f, \"records_per_s\": %.1f, \"errors\": %d, "
                + "\"complete\": %b}", got.get(), s, got.get() / s, errors.get(), got.get() >= expected);
    }
}
