"""``mqgw`` command line: ``serve`` runs the gateway, ``dev`` runs it with its own Redis and broker."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from . import devstack


def _serve_cmd(host: str, port: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "gateway.app:factory", "--factory", "--host", host,
            "--port", str(port), "--workers", str(workers), "--loop", "uvloop", "--http", "httptools",
            "--no-access-log", "--timeout-graceful-shutdown", "5"]


def serve(args: argparse.Namespace) -> int:
    os.execv(sys.executable, _serve_cmd(args.host, args.port, args.workers))
    return 0  # not reached


def dev(args: argparse.Namespace) -> int:
    """Start what is missing (redis-server, Tansu), then the gateway; Ctrl-C stops all of it."""
    started: list[devstack.Service] = []
    env = dict(os.environ)
    try:
        if not (env.get("REDIS_URL") or env.get("MQGW_REDIS_URL")):
            r = devstack.start_redis()
            started.append(r)
            env["MQGW_REDIS_URL"] = r.extra["url"]
            print(f"started redis-server      {r.extra['url']}")
        if not (env.get("KAFKA_BOOTSTRAP") or env.get("MQGW_KAFKA_BOOTSTRAP")):
            b = devstack.start_broker()
            started.append(b)
            env["MQGW_KAFKA_BOOTSTRAP"] = b.extra["bootstrap"]
            print(f"started broker (Tansu)    {b.extra['bootstrap']}")
            devstack.create_topic(b.extra["bootstrap"], "demo", 6)
            print("created topic            demo (6 partitions)")
        gw = subprocess.Popen(_serve_cmd(args.host, args.port, args.workers), env=env,
                              start_new_session=True)
        started.append(devstack.Service("gateway", args.port, gw))
        devstack.wait_port(args.port, timeout=30, proc=gw)
        base = f"http://{args.host}:{args.port}"
        _put_json(f"{base}/consumers/demo-group/config", {"start": "earliest"})
        print(f"""
mq-gateway is up at {base}   (API description: {base}/openapi.yaml)

  curl -s -XPOST {base}/produce -H 'content-type: application/json' \\
       -d '{{"topic":"demo","messages":[{{"key":"k1","value":"hello"}}]}}'
  curl -s '{base}/message?consumer=demo-group&topic=demo&wait_ms=5000'   # demo-group starts at earliest
  curl -s -XPOST {base}/ack -d '{{"requestId":"<requestId from /message>"}}'

Ctrl-C stops the gateway and everything started with it.""", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while gw.poll() is None:
            time.sleep(0.5)
        return gw.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        for s in reversed(started):
            s.stop()


def _put_json(url: str, body: dict) -> None:
    """Let the banner's example consumer read what the example producer wrote before it."""
    import json
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT",
                                 headers={"content-type": "application/json"})
    for _ in range(50):
        try:
            urllib.request.urlopen(req, timeout=5).read()
            return
        except OSError:
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mqgw", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (("serve", serve), ("dev", dev)):
        p = sub.add_parser(name)
        p.add_argument("--host", default=os.environ.get("MQGW_HOST", "127.0.0.1"))
        p.add_argument("--port", type=int, default=int(os.environ.get("MQGW_PORT", "8080")))
        p.add_argument("--workers", type=int, default=int(os.environ.get("MQGW_WORKERS", "2")))
        p.set_defaults(fn=fn)
    args = ap.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
