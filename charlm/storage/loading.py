"""What a path names — a checkpoint file, a run folder or an export folder — decided in one place, above both
formats (checkpoint.py reads checkpoint files, export.py reads export folders; neither imports the other)."""

from __future__ import annotations

from pathlib import Path

from charlm.errors import UsageError
from charlm.storage.checkpoint import Checkpoint, load_checkpoint
from charlm.storage.export import is_export, read_export


def model_path(path: str | Path) -> Path:
    """A checkpoint file as given, the best.pt inside a run folder, or an export folder itself."""
    path = Path(path)
    if path.is_dir():
        if (path / "best.pt").is_file():
            return path / "best.pt"
        if is_export(path):
            return path
        raise UsageError(
            f"{path} is a folder without best.pt: give a checkpoint file, a run folder of `charlm train` "
            "or a folder written by `charlm export`"
        )
    return path


def load_model_file(path: str | Path) -> Checkpoint:
    """The model a path names, read and checked (every problem one UsageError line)."""
    path = model_path(path)
    return read_export(path) if path.is_dir() else load_checkpoint(path)
