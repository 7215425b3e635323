# pymapr-kafkarest 0.1.1 — produce + consume using the library's own API (its README), with
# the minimum work-arounds for its bugs (see FINDINGS.md).
import logging
import sys

from pymapr_kafkarest import MaprKlient
from pymapr_kafkarest.kafkarest import MaprKProducer

logging.getLogger().setLevel(logging.WARNING)   # the lib sets the ROOT logger to DEBUG at import

BASE = (sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18082").rstrip("/") + "/"  # MUST end in "/"

mp = MaprKProducer(BASE, headers={})    # headers=None crashes (dict.update(**None))
mp.retry = 0                            # else the same batch is POSTed 1+3 = 4 times (loop bug)
mp.produce(messages=[{"key": "k1", "value": {"color": "red"}},
                     {"key": "k2", "value": {"color": "blue"}}], topic="demo")

mk = MaprKlient(BASE, "g-mapr", headers={}, topics=["demo"], instance="i-mapr",
                follow_base_uri=True)   # follow_base_uri=True -> use base_uri verbatim
mk.connect(clear=True)                  # GET .../subscription (expects 404), then POST /consumers/g-mapr
mk.subscribe()                          # POST {base_uri}/subscription, expects exactly 204
recs = mk.consume()                     # GET {base_uri}/records, Accept json.v2
print("consumed", recs)
assert [r["value"] for r in recs] == [{"color": "red"}, {"color": "blue"}]
assert [r["key"] for r in recs] == ["k1", "k2"]
again = mk.consume(seek=True)           # POST {base_uri}/positions/beginning then records again
assert len(again) == 2, again
mk._instance_delete()                   # DELETE {base_uri}, expects 204
print("MAPR FLOW OK")
