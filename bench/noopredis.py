"""The ceiling of a request that makes one Redis script call: a Starlette app on the gateway's
own server stack (uvicorn, uvloop, httptools with gateway/api/server.py's protocol, the same
worker count) whose endpoint runs one EVALSHA (read two hash fields, write one, as a lock or ack
does at its smallest) through redis.asyncio with hiredis, as the gateway's store does.

    python bench/noopredis.py PORT WORKERS REDIS_URL      (bench/run.py starts it)
"""

from __future__ import annotations

import os
import sys

import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_SCRIPT = """
local v = redis.call('HMGET', KEYS[1], 'com', 'max')
redis.call('HSET', KEYS[1], 'acc', ARGV[1])
return v[1]
"""
_redis: aioredis.Redis | None = None
_script = None


async def _call(request: Request) -> Response:
    global _redis, _script
    if _script is None:
        _redis = aioredis.Redis.from_url(os.environ["NOOP_REDIS_URL"], max_connections=64)
        _script = _redis.register_script(_SCRIPT)
    await _script(keys=[f"noop:{{{os.getpid()}}}"], args=[1])
    return Response(b'{"ok":true}', media_type="application/json")


async def _healthz(request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


app = Starlette(routes=[Route("/noop-redis", _call), Route("/healthz", _healthz)])


def main() -> None:
    import uvicorn

    from gateway.api.server import GatewayHttpProtocol

    port, workers, url = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.environ["NOOP_REDIS_URL"] = url
    uvicorn.run("noopredis:app", host="127.0.0.1", port=port, workers=workers, loop="uvloop",
                http=GatewayHttpProtocol, log_level="warning", access_log=False, backlog=4096,
                proxy_headers=False,
                timeout_keep_alive=5)


if __name__ == "__main__":
    main()
