"""Flushing a file, or a folder's entries, to disk by path."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | Path, directory: bool = False) -> None:
    """fsync `path`: a file's contents, or, with `directory`, a folder's entries (a rename or a
    new name in it made durable)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
