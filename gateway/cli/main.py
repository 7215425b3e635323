"""``mqgw`` command line: ``serve`` runs the gateway, ``dev`` runs it with its own Redis and broker."""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path

from . import admin as admin_cli
from . import devstack

PROM_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _serve_cmd(host: str, port: int, workers: int) -> list[str]:
    """How ``dev`` starts the gateway: ``mqgw serve`` in a child process."""
    return [sys.executable, "-m", "gateway", "serve", "--host", host, "--port", str(port),
            "--workers", str(workers)]


@contextlib.contextmanager
def prometheus_dir(env: MutableMapping[str, str]) -> Iterator[str]:
    """A clean multiprocess metrics directory in ``env[PROMETHEUS_MULTIPROC_DIR]`` for the workers.

    Counters of every worker (including ones that died and were replaced) are summed from the
    *.db files there, so files left by an earlier run would be counted again: a directory the
    user chose is emptied of them; otherwise a fresh one is made and removed afterwards.
    """
    given = env.get(PROM_ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        for f in glob.glob(os.path.join(given, "*.db")):
            os.remove(f)
        yield given
        return
    path = tempfile.mkdtemp(prefix="mqgw-prom-")
    env[PROM_ENV] = path
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if env.get(PROM_ENV) == path:
            del env[PROM_ENV]


def serve(args: argparse.Namespace) -> int:
    """Run uvicorn in this process (it becomes the workers' supervisor), then clean up."""
    import uvicorn

    from ..config import Settings, hmac_key_refusal

    settings = Settings.load()  # the workers read the same settings
    # Refused here, before uvicorn, as one plain line: inside the workers' lifespan the reason
    # would only show in a JSON-escaped traceback.
    refusal = hmac_key_refusal(settings)
    if refusal is not None:
        print(f"mqgw: {refusal}", file=sys.stderr)
        return 2
    level = settings.log_level
    # uvicorn re-raises the SIGTERM it shut down on; make that an exit that runs the cleanup.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # Set before prometheus_client is imported (gateway.ops.logs imports it): with --workers 1 the
    # app runs in this very process.
    with prometheus_dir(os.environ):
        from ..api.server import GatewayHttpProtocol
        from ..ops import logs

        # The protocol class is pickled by reference into the spawned workers, which build it
        # from their own (inherited) environment: see gateway/api/server.py for its limits.
        # proxy_headers off: the gateway reads X-Forwarded-For itself where it uses a client
        # address (the queue views), and uvicorn's proxy middleware is one more layer per request.
        uvicorn.run("gateway.api.app:factory", factory=True, host=args.host, port=args.port,
                    workers=args.workers, loop="uvloop", http=GatewayHttpProtocol,
                    proxy_headers=False,
                    access_log=False, timeout_keep_alive=settings.keep_alive_timeout_ms / 1000,  # type: ignore[arg-type]
                    # after the drain's own grace (api/drain.py), so uvicorn never cancels a
                    # request itself: its cancel was a 500 and a traceback
                    timeout_graceful_shutdown=settings.stop_grace_ms / 1000 + 1,  # type: ignore[arg-type]
                    backlog=4096, log_config=logs.log_config(level),
                    # whole seconds in uvicorn; at least 1 (0 would kill every worker at once)
                    timeout_worker_healthcheck=max(1, settings.worker_ping_timeout_ms // 1000))
    return 0


def dev(args: argparse.Namespace) -> int:
    """Start what is missing (redis-server, a broker), then the gateway; Ctrl-C stops all of it."""
    started: list[devstack.Service] = []
    # Ctrl-C must stop the stack even when it was started from a script in the background
    # (`make run &`, setsid), where the shell leaves SIGINT ignored for its children.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    env = dict(os.environ)
    taken = _port_taken(args.host, args.port)
    if taken is not None:  # before starting anything: the banner would point at another server
        print(f"mqgw dev: cannot listen on {args.host}:{args.port} ({taken}); another gateway may "
              f"be running there. Pick a free port: MQGW_PORT=8091 make run (or mqgw dev --port "
              f"8091)", file=sys.stderr)
        return 2
    # A development gateway: serve any consumer or producer name, no API keys.
    env.setdefault("MQGW_OPEN_MODE", "true")
    env.setdefault("MQGW_AUTH", "false")
    env.setdefault("MQGW_DEV", "true")  # the workers leave the warnings below to this banner
    own_redis = False
    try:
        if not (env.get("REDIS_URL") or env.get("MQGW_REDIS_URL")):
            r = devstack.start_redis()
            started.append(r)
            own_redis = True
            env["MQGW_REDIS_URL"] = r.extra["url"]
            print(f"started redis-server      {r.extra['url']}")
        if args.broker == "rocketmq":
            if not env.get("MQGW_ROCKETMQ_NAMESRV"):
                from . import rocketmq_dist

                t0 = time.monotonic()
                if not rocketmq_dist.is_resolved():
                    print(f"resolving Apache RocketMQ {rocketmq_dist.VERSION} from Maven Central "
                          f"into {rocketmq_dist.dist_dir()} (once; ~30 s)", flush=True)
                rq = rocketmq_dist.start_rocketmq(timeout=args.start_timeout)
                started.append(rq)
                env["MQGW_ROCKETMQ_NAMESRV"] = rq.extra["namesrv"]
                print(f"started name server (Apache RocketMQ {rocketmq_dist.VERSION}) {rq.extra['namesrv']}"
                      f"\nstarted broker            {rq.extra['broker_addr']}"
                      f"   in {time.monotonic() - t0:.0f} s")
                rocketmq_dist.create_topic(rq.extra["namesrv"], "demo", 6)
                print("created topic            demo (6 queues)")
            env["MQGW_BROKER"] = "rocketmq"
        elif not (env.get("KAFKA_BOOTSTRAP") or env.get("MQGW_KAFKA_BOOTSTRAP")):
            if args.broker == "kafka":
                from . import kafka_dist

                t0 = time.monotonic()
                first = not kafka_dist.is_resolved()
                if first:
                    print(f"resolving Apache Kafka {kafka_dist.VERSION} from Maven Central "
                          f"into {kafka_dist.dist_dir()} (once; ~30 s)", flush=True)
                b = kafka_dist.start_kafka(timeout=args.start_timeout)
                print(f"started broker (Apache Kafka {kafka_dist.VERSION}) {b.extra['bootstrap']}"
                      f"   in {time.monotonic() - t0:.0f} s")
            else:
                b = devstack.start_broker()
                print(f"started broker (Tansu)    {b.extra['bootstrap']}")
                # Tansu defect: a fetch racing producers at its tail can skip records that become
                # readable a moment later, so holes are looked at twice (see Settings).
                env.setdefault("MQGW_GAP_RECHECK_MS", "30")
                # Tansu defect: records written in transactions are not served to the
                # gateway's read_committed reads as Apache Kafka serves them (README, known
                # limitations): the relay's hops go as plain writes there.
                env.setdefault("MQGW_RELAY_EXACTLY_ONCE", "false")
            started.append(b)
            env["MQGW_KAFKA_BOOTSTRAP"] = b.extra["bootstrap"]
            devstack.create_topic(b.extra["bootstrap"], "demo", 6)
            print("created topic            demo (6 partitions)")
        snap_dir = env.get("MQGW_SNAPSHOT_DIR") or "snapshots"
        if own_redis:  # an empty Redis: what the folder holds describes another one
            moved = _set_aside(Path(snap_dir))
            if moved:
                print(f"moved the snapshots of an earlier run to {moved}/ (their Redis and broker "
                      "are gone: one report over both runs would mix them)")
        snap = subprocess.Popen([sys.executable, "-m", "gateway", "snapshot", "--every", "60s",
                                 "--out", snap_dir], env=env, start_new_session=True)
        started.append(devstack.Service("snapshot", 0, snap))
        print(f"started snapshots         every 60 s into {snap_dir}/")
        gw = subprocess.Popen(_serve_cmd(args.host, args.port, args.workers), env=env,
                              start_new_session=True)
        started.append(devstack.Service("gateway", args.port, gw))
        devstack.wait_port(args.port, timeout=args.start_timeout, proc=gw)
        base = f"http://{args.host}:{args.port}"
        _patch_json(f"{base}/admin/consumers/demo-group", {"start": "earliest"})
        broker_env = (f"MQGW_BROKER=rocketmq MQGW_ROCKETMQ_NAMESRV={env['MQGW_ROCKETMQ_NAMESRV']}"
                      if args.broker == "rocketmq" else f"MQGW_KAFKA_BOOTSTRAP={env['MQGW_KAFKA_BOOTSTRAP']}")
        print(f"""
mq-gateway is up at {base}   (API description: {base}/openapi.yaml)

  curl -s -XPOST {base}/produce -H 'content-type: application/json' \\
       -d '{{"topic":"demo","messages":[{{"key":"k1","value":"hello"}}]}}'
  curl -s '{base}/message?consumer=demo-group&topic=demo&wait_ms=5000'   # demo-group starts at earliest
  curl -s -XPOST {base}/ack -d '{{"requestId":"<requestId from /message>"}}'
  curl -s -XPOST {base}/admin/topics -d '{{"name":"orders","partitions":6}}'   # more topics

The command-line tools (mqgw admin, keys, snapshot, report) reach this stack with, in another shell:
  export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH" MQGW_URL={base} \\
         MQGW_REDIS_URL={env["MQGW_REDIS_URL"]} {broker_env}

This is a development stack: no API keys (anyone who reaches the port may do anything), any
consumer or producer name is served, and requestIds are signed with the public development key.

Ctrl-C stops the gateway and everything started with it.""", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while gw.poll() is None:
            time.sleep(0.5)
        return gw.returncode or 0
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError) as e:  # a broker, Redis or the gateway did not start
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"mqgw dev: {reason}\n  (the stack is stopped again; a busy machine may need more "
              f"than {args.start_timeout:.0f} s: MQGW_DEV_START_TIMEOUT=600 make run, or mqgw dev "
              f"--start-timeout 600)", file=sys.stderr)
        return 1
    finally:
        for s in reversed(started):
            s.stop()


def _port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (bound as uvicorn binds it), or None if it can."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        return e.strerror or str(e)
    return None


def _set_aside(snap_dir: Path) -> Path | None:
    """Move an earlier run's snapshots out of the way (to ``<dir>.<time>``) and return where.

    ``make run`` starts an empty Redis and broker each time, so snapshots of the previous run
    describe consumers and offsets that no longer exist; a report over the folder would join the
    two runs' lines into one. Moved rather than deleted: they are still a report of that run."""
    if not snap_dir.is_dir() or not any(snap_dir.iterdir()):
        return None
    dest = snap_dir.with_name(f"{snap_dir.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while dest.exists():
        dest, n = dest.with_name(f"{snap_dir.name}.{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
    snap_dir.rename(dest)
    return dest


def _patch_json(url: str, body: dict[str, str]) -> None:
    """Let the banner's example consumer read what the example producer wrote before it."""
    import json
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PATCH",
                                 headers={"content-type": "application/json"})
    for _ in range(50):
        try:
            urllib.request.urlopen(req, timeout=5).read()
            return
        except OSError:
            time.sleep(0.1)


def relay(args: argparse.Namespace) -> int:
    """Run only the delay relay (for those who scale it apart from the HTTP nodes, which then
    run with ``MQGW_RELAY=false``); stops cleanly on SIGTERM or Ctrl-C."""
    import asyncio

    from ..config import Settings
    from ..ops import gc_tuning, logs
    from ..services import close_services, open_services

    settings = Settings.load()
    logs.configure(settings.log_level)
    gc_tuning.tune_for_serving()

    async def run() -> None:
        services = await open_services(settings, serve=False)  # restores; HTTP nodes save
        try:
            if services.relay is None:
                print(f"the {services.broker.name} broker delays records itself: there is "
                      "nothing to relay", file=sys.stderr)
                return
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            print(f"relaying {len(services.delay.wheel.levels)} delay levels "
                  f"({settings.delay_topic_prefix}*); Ctrl-C stops", file=sys.stderr)
            await stop.wait()
        finally:
            await close_services(services)

    asyncio.run(run())
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    from ..ops import snapshot  # imports pyarrow: only for this command

    return snapshot.run(args)


def version() -> str:
    """The installed distribution's version (what pip and bug reports name); the package's own
    ``__version__`` when run from a checkout that is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mq-gateway")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mqgw", description=__doc__)
    ap.add_argument("--version", action="version", version=f"mq-gateway {version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn, text in (
            ("serve", serve, "run the gateway (uvicorn workers; settings from MQGW_* and MQGW_CONFIG)"),
            ("dev", dev, "start a local redis-server and broker if none are configured, then the "
                         "gateway in open mode without keys (what make run does)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--host", default=os.environ.get("MQGW_HOST", "127.0.0.1"))
        p.add_argument("--port", type=int, default=int(os.environ.get("MQGW_PORT", "8080")))
        p.add_argument("--workers", type=int, default=int(os.environ.get("MQGW_WORKERS", "2")))
        if name == "dev":
            p.add_argument("--broker", choices=("kafka", "tansu", "rocketmq"),
                           default=os.environ.get("MQGW_DEV_BROKER", "kafka"),
                           help="the broker to start when KAFKA_BOOTSTRAP is not set: Apache Kafka "
                                "from its Maven jars (default; needs Java 17 and Maven), or Tansu, "
                                "the stand-in that starts in milliseconds (it under-reports end "
                                "offsets: see README, Known limitations), or Apache RocketMQ "
                                "(a name server and a broker from Maven jars, unless "
                                "MQGW_ROCKETMQ_NAMESRV is set)")
            p.add_argument("--start-timeout", type=float,
                           default=float(os.environ.get("MQGW_DEV_START_TIMEOUT", "300")),
                           help="seconds the broker may take to start (default 300, or "
                                "MQGW_DEV_START_TIMEOUT; a loaded machine took over 90)")
        p.set_defaults(fn=fn)
    admin_cli.add_commands(sub)
    p = sub.add_parser("relay", help="run only the relay that moves delayed records along the delay "
                                     "wheel (gateway nodes run one each unless MQGW_RELAY=false)")
    p.set_defaults(fn=relay)
    p = sub.add_parser("snapshot", help="sample every consumer's queue state into Parquet files")
    p.add_argument("--every", default="60s", help="interval: 60s, 2m, 500ms or seconds (default 60s)")
    p.add_argument("--out", default=os.environ.get("MQGW_SNAPSHOT_DIR") or "snapshots",
                   help="output directory (default $MQGW_SNAPSHOT_DIR or ./snapshots)")
    p.add_argument("--once", action="store_true", help="take one sample, print a JSON summary, exit")
    p.add_argument("--redis-url", help="default: the gateway's redis_url setting")
    p.add_argument("--broker", help="value of the broker column (default: the broker setting, MQGW_BROKER)")
    p.add_argument("-v", "--verbose", action="store_true", help="a line on stderr per sample")
    p.set_defaults(fn=_snapshot)
    from ..reports import job as report_job  # imports pyspark only when the command runs

    p = sub.add_parser("report", help="lag/backlog report from snapshots, with Spark")
    report_job.add_arguments(p)
    p.set_defaults(fn=report_job.run)
    args = ap.parse_args(argv)
    from ..config import SettingsError

    try:
        return int(args.fn(args))
    except SettingsError as e:  # one line, not a traceback: see SettingsError
        print(f"mqgw: bad setting: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
