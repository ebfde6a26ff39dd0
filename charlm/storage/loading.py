"""What a path names — a checkpoint file, a run folder, an export folder or an ONNX export — decided in one place,
above the formats (checkpoint.py reads checkpoint files, export.py export folders, onnx_export.py ONNX exports)."""

from __future__ import annotations

from pathlib import Path

from charlm.errors import UsageError
from charlm.storage.checkpoint import Checkpoint, load_checkpoint
from charlm.storage.export import is_export, read_export
from charlm.storage.onnx_export import is_onnx_export


def model_path(path: str | Path) -> Path:
    """A checkpoint file as given, the best.pt inside a run folder, or an export folder itself."""
    path = Path(path)
    if path.is_dir():
        if (path / "best.pt").is_file():
            return path / "best.pt"
        if is_export(path) or is_onnx_export(path):
            return path
        raise UsageError(
            f"{path} is a folder without best.pt: give a checkpoint file, a run folder of `charlm train` "
            "or a folder written by `charlm export`"
        )
    return path


def load_model_file(path: str | Path) -> Checkpoint:
    """The model a path names, read and checked (every problem one UsageError line)."""
    path = model_path(path)
    if is_onnx_export(path):  # graphs, not weights: charlm.load runs them through onnxruntime
        raise UsageError(
            f"{path} is an ONNX export: `charlm sample` and `charlm eval` run it (onnxruntime); this needs the "
            "checkpoint it came from or a safetensors export"
        )
    return read_export(path) if path.is_dir() else load_checkpoint(path)
