"""Summarise py-spy ``--format raw`` profiles (collapsed stacks) written by ``run.py --profile``.

    .venv/bin/python bench/profsummary.py bench/results/profile-<stamp>/f32-*.txt [--top 25]

Prints, over all given files: samples per thread kind, the functions with the most
*self* samples (where the CPU is spent) and the most *inclusive* samples (which
call paths it is spent under). Frames look like ``function (file.py:line)``; the line
is dropped so one function is one row.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

#: Paths are shown from these on: installed packages, the standard library, this checkout.
_MARKERS = ("site-packages/", "/lib/python3", f"{Path(__file__).resolve().parent.parent}/")
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in _MARKERS:
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m.group('fn')} ({path})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--match", default="", help="only stacks containing this text")
    args = ap.parse_args()
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for path in args.files:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
        for line in lines:
            if not line:
                continue
            stack, _, n = line.rpartition(" ")
            if not n.isdigit() or (args.match and args.match not in stack):
                continue
            count = int(n)
            frames = stack.split(";")
            body = frames
            kind = "?"
            if frames and frames[0].startswith("thread ("):  # py-spy --threads: "thread (tid): name"
                kind = re.sub(r"_\d+$", "_N", frames[0].split(": ", 1)[-1])
                body = frames[1:]
            threads[kind] += count
            total += count
            names = [frame_name(f) for f in body]
            if names:
                self_c[names[-1]] += count
            for name in set(names):
                incl_c[name] += count
    print(f"{total} samples in {len(args.files)} file(s)")
    print("\nby thread:")
    for k, v in threads.most_common(10):
        print(f"  {100 * v / total:5.1f}%  {k}")
    print(f"\ntop {args.top} self:")
    for k, v in self_c.most_common(args.top):
        print(f"  {100 * v / total:5.1f}%  {k}")
    print(f"\ntop {args.top} inclusive:")
    for k, v in incl_c.most_common(args.top):
        print(f"  {100 * v / total:5.1f}%  {k}")


if __name__ == "__main__":
    main()
