"""Durable file writes: what atomic-rename writers (snapshots, reports) need besides the rename."""

from __future__ import annotations

import os


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory by name. A rename is durable only once the directory that
    holds the new name is fsynced, and a file's data only once the file is."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
