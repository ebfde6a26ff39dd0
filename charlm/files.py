"""Writing files so that a crash, a full disk or a kill never leaves a half-written file in place."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Any) -> None:
    """Call write(file) on a temp file in the same folder, fsync it, then rename it over `path`.

    On any failure the temp file is removed and `path` is untouched.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def remove_stale_temps(path: Path) -> list[Path]:
    """Temp files left by a writer that was killed mid-write (never the real file)."""
    removed = []
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
            removed.append(stale)
    return removed


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
