"""Writing files so that a crash, a full disk or a kill never leaves a half-written file in place."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Any) -> None:
    """Call write(file) on a temp file in the same folder, fsync it, then rename it over `path`.

    On any failure the temp file is removed and `path` is untouched. The file keeps the mode of the one it replaces,
    or takes the one open() would give it (not mkstemp's 0600: a run folder or an export is read by others).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _mode_for(path))
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~current_umask()


def remove_stale_temps(path: Path) -> list[Path]:
    """Temp files left by a writer that was killed mid-write (never the real file)."""
    removed = []
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
            removed.append(stale)
    return removed


def folder_beside(target: Path) -> Path:
    """A new empty temp folder beside `target`, readable by others as mkdir would make it (not mkdtemp's 0700): a
    folder written whole there, then renamed into place with replace_folder."""
    target = Path(os.path.abspath(target))  # "." has no name to take one beside it
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    temp.chmod(0o777 & ~current_umask())
    return temp


def current_umask() -> int:
    """The process's umask: Linux says it in /proc; elsewhere it is read by setting it, then put back at once."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        lines = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in lines if line.startswith("Umask:")).split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def replace_folder(temp: Path, target: Path) -> None:
    """The finished folder `temp` renamed to `target`; an old `target` is renamed aside first, and removed only once
    the new one is in place (put back if the rename fails)."""
    target = Path(os.path.abspath(target))
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.{time.time_ns()}.old")
        target.rename(old)
    try:
        temp.rename(target)
    except OSError:
        if old is not None:
            old.rename(target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def folder_problem(folder: Path, error: OSError) -> str:
    """Why a folder could not be made, in words: a file in the way is named (mkdir says only 'File exists')."""
    for part in (folder, *folder.parents):
        if part.exists():
            return f"{part} is a file, not a folder" if not part.is_dir() else str(error.strerror)
    return str(error.strerror)
