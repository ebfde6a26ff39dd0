"""What a path names — a checkpoint file, a run folder, an export folder or an ONNX export — decided in one place,
above the formats (checkpoint.py reads checkpoint files, export.py export folders, onnx_export.py ONNX exports)."""

from __future__ import annotations

from pathlib import Path

from charlm.errors import UsageError
from charlm.storage.checkpoint import Checkpoint, load_checkpoint
from charlm.storage.export import CONFIG, VOCAB, is_export, read_export
from charlm.storage.onnx_export import EXPORT_AGAIN, ONNX_FORMAT, is_onnx_export


def model_path(path: str | Path) -> Path:
    """A checkpoint file as given, the best.pt inside a run folder, or an export folder itself."""
    path = Path(path)
    if path.is_dir():
        if (path / "best.pt").is_file():
            return path / "best.pt"
        if is_export(path) or is_onnx_export(path):
            return path
        _refuse_broken_onnx_export(path)
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


def _refuse_broken_onnx_export(folder: Path) -> None:
    """Graphs without a config.json that says they are an ONNX export's (deleted, damaged or another tool's): said as
    such, not as a folder the user mistook for a run's. Worded to hold whether or not charlm wrote the graphs."""
    if not any(folder.glob("*.onnx")):
        return
    if missing := [name for name in (CONFIG, VOCAB) if not (folder / name).is_file()]:
        raise UsageError(
            f"{folder} holds ONNX graphs but lacks {', '.join(missing)}, which a charlm ONNX export needs: export it "
            f"again ({EXPORT_AGAIN})"
        )
    raise UsageError(
        f"{folder} holds ONNX graphs, but its {CONFIG} is not a charlm ONNX export's (format {ONNX_FORMAT} expected): "
        f"export it again ({EXPORT_AGAIN})"
    )


def model_kind(path: str | Path) -> str | None:
    """What a path given as a model is, in words, where it is plainly a model and not a folder to write into: a run
    folder or a checkpoint file (None for anything else)."""
    path = Path(path)
    if path.is_dir() and any((path / name).is_file() for name in ("best.pt", "last.pt")):
        return "a run folder"
    if path.is_file() and path.suffix == ".pt":
        return "a checkpoint file"
    return None
