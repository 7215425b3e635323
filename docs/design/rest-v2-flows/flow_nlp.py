# nlp-kafka-rest-api 1.0.0 — produce + consume using the library's own API (README "Pattern 2").
import os
import sys

for v in ("KAFKA_REST_API_URL", "TOPIC_ID", "X_API_KEY"):   # env vars OVERRIDE kwargs in this lib
    os.environ.pop(v, None)
from kafka_rest import Consumer, Producer  # noqa: E402  (after the environment is cleared)

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18082"
# The Consumer always subscribes to f"{topic_id}-response"; so produce straight to "demo-response".
producer = Producer(kafka_rest_api_url=BASE, topic_id="demo-response")
keys = producer.produce([{"text": "hello"}, {"text": "world"}], endpoint="echo")
print("produced keys", keys)

consumer = Consumer(kafka_rest_api_url=BASE, topic_id="demo",
                    consumer_group="g-nlp", instance="i-nlp")
consumer.create().subscribe()
got = consumer.consume_all(keys, interval_sec=0)   # polls GET .../records until every key seen
print("consumed", got)
consumer.delete()
flat = [d for batch in got for d in batch]
assert sorted(d["key"] for d in flat) == sorted(keys)
assert {d["value"]["payload"]["text"] for d in flat} == {"hello", "world"}
assert all(d["value"]["endpoint"] == "echo" for d in flat)
print("NLP FLOW OK")
