// npm kafka-rest 0.0.5 (confluentinc/kafka-rest-node) — v1-only client. Shown for completeness.
const KafkaRest = require('kafka-rest');
const BASE = process.argv[2] || 'http://127.0.0.1:18082';
KafkaRest.prototype.SUPPORTED_VERSIONS = [1, 2];      // monkey-patch: library refuses version 2
const kafka = new KafkaRest({url: BASE, version: 2});
kafka.topics.list((err, topics) => {
  if (err) throw err;
  console.log('topics', topics.map(t => t.name));
  kafka.topic('demo').produce({key: 'nk', value: 'node-msg'}, (err, res) => {
    console.log('produce', err ? err.toString() : JSON.stringify(res));
    kafka.consumer('g-node').join({name: 'i-node', format: 'binary', 'auto.offset.reset': 'earliest'},
      (err, ci) => {
        if (err) throw err;
        console.log('instance', ci.id, ci.uri);
        const stream = ci.subscribe('demo');            // v1 route: GET {base_uri}/topics/demo
        stream.on('error', e => {
          console.log('stream error', e.toString());
          ci.commit((e2, r2) => {                        // POST {base_uri}/offsets, null body
            console.log('commit', e2 ? e2.toString() : JSON.stringify(r2));
            ci._shutdownInstance(e3 => { console.log('delete', e3 ? e3.toString() : 'ok'); process.exit(0); });  // shutdown() would wait forever for the errored stream
          });
        });
        stream.on('data', msgs => console.log('data', msgs));
      });
  });
});
