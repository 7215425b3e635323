"""Gateway nodes as production runs them: API keys required, unregistered names refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import ROOT, Node, start_node

SECURE = {"auth": "true", "open_mode": "false"}


def bootstrap_admin_key(redis_url: str) -> str:
    """``mqgw keys bootstrap``, the way an operator gets the first admin key."""
    out = subprocess.run([sys.executable, "-m", "gateway", "keys", "bootstrap", "--name", "ops"],
                         cwd=ROOT, env={**os.environ, "MQGW_REDIS_URL": redis_url},
                         capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)["key"]


@dataclass
class Secure:
    """Secure nodes plus an admin key and an HTTP client."""

    nodes: list[Node]
    admin_key: str
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def url(self, path: str, node: int = 0) -> str:
        return self.nodes[node].url + path

    def call(self, method: str, path: str, key: str | None = None, node: int = 0,
             **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return self.http.request(method, self.url(path, node), headers=headers, **kw)

    def admin(self, method: str, path: str, node: int = 0, expect: int | tuple[int, ...] = (200, 201),
              **kw: Any) -> Any:
        r = self.call(method, path, self.admin_key, node, **kw)
        assert r.status_code in ((expect,) if isinstance(expect, int) else expect), r.text
        return r.json()

    def key(self, name: str, **grants: Any) -> str:
        return self.admin("POST", "/admin/keys", json={"name": name, **grants})["key"]


@pytest.fixture(scope="module")
def sec(redis_url: str, bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    """Two secure nodes for one test module."""
    s = start_secure(redis_url, bootstrap, tmp_path_factory.mktemp("secure"), n=2)
    try:
        yield s
    finally:
        s.http.close()
        for n in s.nodes:
            n.stop()


def start_secure(redis_url: str, bootstrap: str, tmp: Path, n: int = 2, **settings: Any) -> Secure:
    nodes = []
    try:
        for _ in range(n):
            nodes.append(start_node(redis_url, bootstrap, tmp, **{**SECURE, **settings}))
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return Secure(nodes, bootstrap_admin_key(redis_url))
