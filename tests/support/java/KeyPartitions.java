// Where Kafka's Java client puts keys, for tests/system/test_partitioner.py: the reference the gateway's
// key partitioning is checked against (needs only kafka-clients and its dependencies).
//
//   java -cp 'JARS/*' KeyPartitions.java hash N[,N...] HEXKEY...
//       one line per key ('-': the empty key): HEXKEY MURMUR2 and its partition in a topic of
//       each N partitions, computed by the producer's own code (Utils.murmur2, and
//       BuiltInPartitioner.partitionForKey, which KafkaProducer calls for a keyed record)
//   java -cp 'JARS/*' KeyPartitions.java produce BOOTSTRAP TOPIC HEXKEY...
//       sends one record per key with a KafkaProducer (default partitioner) and prints
//       HEXKEY PARTITION as the broker acknowledged it
import java.util.HexFormat;
import java.util.Properties;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

public class KeyPartitions {
    public static void main(String[] args) throws Exception {
        HexFormat hex = HexFormat.of();
        if (args[0].equals("hash")) {
            String[] counts = args[1].split(",");
            for (int i = 2; i < args.length; i++) {
                byte[] key = args[i].equals("-") ? new byte[0] : hex.parseHex(args[i]);
                StringBuilder line = new StringBuilder(args[i] + " " + Utils.murmur2(key));
                for (String n : counts) {
                    line.append(' ').append(BuiltInPartitioner.partitionForKey(key, Integer.parseInt(n)));
                }
                System.out.println(line);
            }
            return;
        }
        Properties p = new Properties();
        p.put("bootstrap.servers", args[1]);
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.put("acks", "all");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (int i = 3; i < args.length; i++) {
                byte[] key = args[i].equals("-") ? new byte[0] : hex.parseHex(args[i]);
                RecordMetadata md = producer.send(new ProducerRecord<>(args[2], key, "java".getBytes())).get();
                System.out.println(args[i] + " " + md.partition());
            }
        }
    }
}
