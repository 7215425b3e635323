"""Placeholder HMAC keys are refused at start with auth on (issue 13): `mqgw serve` says so in
one plain line on stderr and exits non-zero before uvicorn starts, and the app's own start-up
check (for servers started otherwise) uses the same rule."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import (
    DEV_HMAC_KEY,
    MIN_HMAC_KEY_BYTES,
    PLACEHOLDER_HMAC_KEYS,
    Settings,
    hmac_key_problem,
    hmac_key_refusal,
)

from ..support import HMAC_KEY

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_PLACEHOLDER = "replace-with-output-of-openssl-rand-hex-32"


@pytest.mark.parametrize("key", [
    DEV_HMAC_KEY, SHIPPED_PLACEHOLDER, "CHANGE-ME-please-0123456789", "my-changeme-key-0123456789",
    "replace-this-secret-value", "an-Example-key-0123456789", "<placeholder-0123456789>",
    "", "secret", "a" * (MIN_HMAC_KEY_BYTES - 1),
])
def test_placeholder_keys_are_problems(key: str) -> None:
    problem = hmac_key_problem(key)
    assert problem is not None and problem.startswith("MQGW_HMAC_KEY ")
    refusal = hmac_key_refusal(Settings(hmac_key=key, auth=True))
    assert refusal is not None and problem in refusal and "\n" not in refusal
    # without auth the key guards nothing anyway: a warning, not a refusal (make run, the tests)
    assert hmac_key_refusal(Settings(hmac_key=key, auth=False)) is None


@pytest.mark.parametrize("key", [
    secrets.token_hex(32), secrets.token_urlsafe(16), "é" * (MIN_HMAC_KEY_BYTES // 2),
    HMAC_KEY,  # the suite's nodes with auth on use it
])
def test_real_keys_pass(key: str) -> None:
    assert hmac_key_problem(key) is None
    assert hmac_key_refusal(Settings(hmac_key=key, auth=True)) is None


def test_the_shipped_placeholders_are_listed() -> None:
    assert {DEV_HMAC_KEY, SHIPPED_PLACEHOLDER} <= PLACEHOLDER_HMAC_KEYS
    assert Settings().hmac_key == DEV_HMAC_KEY
    assert "public default" in (hmac_key_problem(DEV_HMAC_KEY) or "")


def _serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MQGW_")}
    # Nothing listens there: a node that got as far as connecting would fail differently.
    base.update({"MQGW_REDIS_URL": "redis://127.0.0.1:1/0", "MQGW_KAFKA_BOOTSTRAP": "127.0.0.1:1",
                 "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")})
    base.update(env)
    return subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1",
                           "--port", "1", "--workers", "1"], env=base, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("key", "why"), [
    (DEV_HMAC_KEY, "is the public default"),
    (SHIPPED_PLACEHOLDER, "is the placeholder of the deploy examples"),
    ("please-change-me-0123456789", "looks like a placeholder"),
    ("short", "is too short"),
])
def test_serve_refuses_in_one_plain_line(tmp_path: Path, key: str, why: str) -> None:
    out = _serve(tmp_path, MQGW_AUTH="true", MQGW_HMAC_KEY=key)
    assert out.returncode == 2, out
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("mqgw: refusing to start: auth is on and MQGW_HMAC_KEY "), lines
    assert why in lines[0] and "openssl rand -hex 32" in lines[0]
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not (tmp_path / "prom").exists()  # refused before anything was set up


@pytest.mark.timeout(120)
def test_serve_refuses_a_placeholder_from_the_toml_file(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[gateway]\nauth = true\nhmac_key = "replace-me-with-a-real-secret"\n')
    out = _serve(tmp_path, MQGW_CONFIG=str(config))
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and "looks like a placeholder" in out.stderr


def test_the_app_refuses_too_with_the_same_words() -> None:
    """A server that does not go through `mqgw serve` (uvicorn gateway.api.app:factory) still
    refuses, at start-up, with the same sentence."""
    from gateway.api.app import create_app

    settings = Settings(broker="memory", auth=True, hmac_key=SHIPPED_PLACEHOLDER)
    app = create_app(settings)

    async def start() -> None:
        async with app.router.lifespan_context(app):
            pass

    with pytest.raises(RuntimeError) as e:
        asyncio.run(start())
    assert str(e.value) == hmac_key_refusal(settings)
