"""pymapr-kafkarest 0.1.1 (PyPI): its own produce-then-consume flow, through its own API, with
the two settings its bugs need (docs/design/rest-v2-clients.md, section 3). The only published
client that uses the ``base_uri`` the server answers (``follow_base_uri=True``).

    python flow_mapr.py BASE_URL TOPIC GROUP

TOPIC has one partition (the library seeks partition 0 only).
"""

import logging
import sys

from pymapr_kafkarest import MaprKlient
from pymapr_kafkarest.kafkarest import MaprKProducer

logging.getLogger().setLevel(logging.WARNING)  # the library sets the root logger to DEBUG

base, topic, group = sys.argv[1].rstrip("/") + "/", sys.argv[2], sys.argv[3]  # must end in "/"

mp = MaprKProducer(base, headers={})  # its default headers=None fails (dict.update(**None))
mp.retry = 0  # else each produce is POSTed four times (its retry loop does not stop on 200)
mp.produce(messages=[{"key": "k1", "value": {"color": "red"}},
                     {"key": "k2", "value": {"color": "blue"}}], topic=topic)

mk = MaprKlient(base, group, headers={}, topics=[topic], instance="i-mapr", follow_base_uri=True)
mk.connect(clear=True)  # GET .../subscription (404: no instance yet), then POST /consumers/GROUP
assert mk.instance_url.startswith(base.rstrip("/")), mk.instance_url  # the base_uri, as answered
mk.subscribe()  # POST {base_uri}/subscription: exactly 204
recs = mk.consume()  # GET {base_uri}/records, json
assert [r["value"] for r in recs] == [{"color": "red"}, {"color": "blue"}], recs
assert [r["key"] for r in recs] == ["k1", "k2"], recs
again = mk.consume(seek=True)  # POST {base_uri}/positions/beginning, then the records again
assert [r["key"] for r in again] == ["k1", "k2"], again
mk._instance_delete()  # DELETE {base_uri}: 204
print("MAPR FLOW OK")
