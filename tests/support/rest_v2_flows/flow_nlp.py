"""nlp-kafka-rest-api 1.0.0 (PyPI, MIT): its own produce-then-consume flow, through its own API
and unpatched (docs/design/rest-v2-clients.md, section 2).

    python flow_nlp.py BASE_URL TOPIC GROUP

It produces as json (``Producer.produce`` wraps each value as ``{"endpoint", "payload"}``) to
``TOPIC-response`` (its Consumer always subscribes to ``<topic_id>-response``), makes a binary
consumer instance, reads until it saw every key it produced, and deletes the instance. The
caller bounds it in time: ``consume_all`` polls until every key came.
"""

import os
import sys

for v in ("KAFKA_REST_API_URL", "TOPIC_ID", "X_API_KEY"):  # the library prefers these to kwargs
    os.environ.pop(v, None)
from kafka_rest import Consumer, Producer  # noqa: E402  (after the environment is cleared)

base, topic, group = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
producer = Producer(kafka_rest_api_url=base, topic_id=f"{topic}-response")
keys = producer.produce([{"text": "hello"}, {"text": "world"}], endpoint="echo")
consumer = Consumer(kafka_rest_api_url=base, topic_id=topic, consumer_group=group,
                    instance="i-nlp")
consumer.create().subscribe()
got = consumer.consume_all(keys, interval_sec=0)
consumer.delete()
flat = [d for batch in got for d in batch]
assert sorted({d["key"] for d in flat}) == sorted(keys), (flat, keys)
assert {d["value"]["payload"]["text"] for d in flat} == {"hello", "world"}, flat
assert all(d["value"]["endpoint"] == "echo" for d in flat), flat
print("NLP FLOW OK")
