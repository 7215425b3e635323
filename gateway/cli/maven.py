"""Brokers from their Maven Central jars: where they are cached, and resolving them once.

The machines reach package registries only (no release tarballs), so Apache Kafka and Apache
RocketMQ run the way embedded-broker test harnesses run them: a generated pom, ``mvn
dependency:copy-dependencies`` into a cache directory, then ``java -cp '<dir>/*' <main class>``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir(env_var: str, name: str) -> Path:
    """``$<env_var>``, else ``~/.cache/mqgw/<name>`` (``XDG_CACHE_HOME`` honoured)."""
    given = os.environ.get(env_var)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mqgw"
    return Path(given) if given else base / name


def is_resolved(target: Path) -> bool:
    return (target / ".complete").exists()


def resolve(target: Path, pom: str, what: str, hint: str, timeout: float = 900.0,
            then: Callable[[Path, Path], None] | None = None) -> Path:
    """The jars of ``pom`` in ``target``, resolved with Maven the first time.

    Several processes may ask at once (parallel tests, two ``make run``): one resolves under a
    lock, into a temporary directory renamed into place, so nobody sees half a directory.
    ``then(libs, work)`` may add to the jars before they are put in place (compiled classes)."""
    if is_resolved(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_resolved(target):
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError(f"{what} is started from its Maven Central jars: install Maven "
                               f"and {hint}")
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            (work / "pom.xml").write_text(pom)
            libs = work / "libs"
            out = subprocess.run([mvn, "-q", "-B", "dependency:copy-dependencies",
                                  f"-DoutputDirectory={libs}", "-DincludeScope=runtime"],
                                 cwd=work, capture_output=True, text=True, timeout=timeout)
            if out.returncode != 0:
                raise RuntimeError(f"mvn could not resolve {what}:\n{(out.stdout + out.stderr)[-3000:]}")
            if then is not None:
                then(libs, work)
            shutil.rmtree(target, ignore_errors=True)
            libs.rename(target)
            (target / ".complete").write_text(what)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target
