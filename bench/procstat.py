"""CPU accounting from /proc: who used the 2 cores during a measured window.

The machine is shared, so every phase also records how busy the whole machine was
and how much of that was *not* ours (other people's tests), which says how far a
figure can be trusted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


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
