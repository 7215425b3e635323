"""CPU accounting from /proc: who used the 2 cores during a measured window, and what a
command's whole process tree used (:func:`run_tree`).

The machine is shared, so every phase also records how busy the whole machine was
and how much of that was *not* ours (other people's tests), which says how far a
figure can be trusted.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_cpu_s(pid: int) -> float:
    """utime+stime of a process (all its threads), seconds; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    total = sum(v[:8])
    return (total - idle) / _TICK, total / _TICK


def children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except FileNotFoundError:
        pass
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def uvicorn_workers(master: int) -> list[int]:
    """The worker processes of a ``uvicorn --workers N`` master (not its resource tracker)."""
    return sorted(p for p in children(master) if "spawn_main" in cmdline(p))


def connections_per_pid(port: int, pids: list[int]) -> dict[int, int]:
    """How many ESTABLISHED sockets on local ``port`` each pid holds (accepted connections)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    f = line.split()
                    if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01":
                        inodes.add(f[9])
        except FileNotFoundError:
            pass
    out = {}
    for pid in pids:
        n = 0
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    n += 1
        except FileNotFoundError:
            pass
        out[pid] = n
    return out


@dataclass
class CpuSnapshot:
    procs: dict[str, float]
    busy: float
    total: float


def snapshot(named: dict[str, int]) -> CpuSnapshot:
    busy, total = machine_cpu_s()
    return CpuSnapshot({k: proc_cpu_s(p) for k, p in named.items()}, busy, total)


def usage(a: CpuSnapshot, b: CpuSnapshot, wall: float) -> dict[str, float]:
    """Percent of one core per process over [a, b], plus the machine (100% = both cores)."""
    out = {k: round(100 * (b.procs[k] - a.procs.get(k, 0.0)) / wall, 1) for k in b.procs}
    ours = sum(out.values())
    ncpu = os.cpu_count() or 1
    machine = 100 * (b.busy - a.busy) / wall  # in "percent of one core"
    out["machine_busy_pct_of_all_cores"] = round(machine / ncpu, 1)
    out["others_pct_of_one_core"] = round(max(0.0, machine - ours), 1)
    return out


def tree(root: int) -> dict[int, tuple[float, int]]:
    """``root`` and every descendant alive now (a JVM that a child started is a grandchild): pid
    -> (its own CPU seconds, user + system; its resident bytes), read from /proc/*/stat."""
    parent: dict[int, int] = {}
    stat: dict[int, tuple[float, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(d)] = int(fields[1])
            stat[int(d)] = ((int(fields[11]) + int(fields[12])) / _TICK,  # utime + stime
                            int(fields[21]) * _PAGE)
        except (OSError, IndexError, ValueError):
            continue
    found, todo = set(), [root]
    while todo:
        p = todo.pop()
        found.add(p)
        todo += [c for c, pp in parent.items() if pp == p and c not in found]
    return {p: stat[p] for p in found if p in stat}


@dataclass
class TreeRun:
    """A command run to its end with its process tree polled: the CPU time counts each process
    once, at its last poll (not its children's cutime too); the peak is of the whole tree's RSS."""

    done: subprocess.CompletedProcess[str]
    wall_s: float
    cpu_s: float
    peak_rss: int


def run_tree(cmd: list[str], cwd: Path, env: dict[str, str], poll_s: float) -> TreeRun:
    """Run ``cmd`` to its end, reading its process tree every ``poll_s`` seconds."""
    cpu: dict[int, float] = {}
    peak = 0
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
        while p.poll() is None:
            now = tree(p.pid)
            for pid, (s, _) in now.items():
                cpu[pid] = max(cpu.get(pid, 0.0), s)
            peak = max(peak, sum(rss for _, rss in now.values()))
            time.sleep(poll_s)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(cmd, p.returncode, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))
    return TreeRun(done, wall, sum(cpu.values()), peak)
