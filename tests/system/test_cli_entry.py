"""The installed ``mqgw`` command (the console script the Dockerfile and the README use) starts:
tests elsewhere run ``python -m gateway``, which would not notice a broken entry point."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path


def test_the_mqgw_console_script_runs() -> None:
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "mqgw"]
    assert callable(ep.load())
    script = Path(sys.executable).with_name("mqgw")
    p = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    for command in ("serve", "dev", "admin", "snapshot", "report"):
        assert command in p.stdout


def test_version() -> None:
    """``mqgw --version`` prints the installed package's version, which is also the one the
    package says it is (pyproject.toml and gateway/__init__.py agree)."""
    from importlib.metadata import version

    import gateway

    script = Path(sys.executable).with_name("mqgw")
    p = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"mq-gateway {version('mq-gateway')}\n"
    assert version("mq-gateway") == gateway.__version__
