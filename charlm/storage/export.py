"""Exports: a folder anyone can load without unpickling — weights in safetensors, config and vocabulary in JSON, and a
README.md model card. `charlm sample/eval/info DIR` and `charlm.load(DIR)` read it; logits equal the checkpoint's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from charlm.config.build import config_from_dict
from charlm.data.tokenizer import tokenizer_from_json
from charlm.errors import UsageError
from charlm.files import atomic_write, folder_beside, folder_problem, replace_folder
from charlm.storage.checkpoint import Checkpoint
from charlm.storage.web_export import BUNDLED, PAGE_FILES
from charlm.version import __version__

WEIGHTS, CONFIG, VOCAB, CARD = "model.safetensors", "config.json", "vocab.json", "README.md"
EXPORT_FORMAT = "charlm-export-1"


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise UsageError(
            'exports need the safetensors package: pip install -e ".[export]" in your charlm checkout '
            "(or pip install safetensors)"
        ) from None
    return safetensors.torch


def is_export(path: Path) -> bool:
    """A folder written by `charlm export`, judged by its weights file or its config.json's format (either one: an
    export missing the other is still one, and read_export names what it lacks)."""
    return path.is_dir() and ((path / WEIGHTS).is_file() or export_format(path) == EXPORT_FORMAT)


def export_format(folder: Path) -> str | None:
    """The format its config.json names (charlm-export-1, charlm-onnx-1), or None where there is none to read."""
    try:
        raw = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(raw.get("format", "")) if isinstance(raw, dict) else None


def lacks(what: str, folder: Path, names: list[str], again: str = "charlm export CKPT DIR") -> UsageError:
    """An export with files deleted: which, and how to make it whole (a new export: none of them can be rebuilt from
    the rest)."""
    return UsageError(f"{what} {folder} lacks {', '.join(names)}: export it again ({again})")


def check_target(out_dir: str | Path, overwrite: bool) -> None:
    """Refuse in one line (nothing written) where an export may not go: a file; the current folder or one above it;
    a folder with anything in it, without --overwrite; with it, a folder that is not an earlier export or holds
    anything an export does not write (a run folder, a project, a web host's .git: never the user's other files)."""
    out = export_path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out_dir} is a file, not a folder: choose another DIR")
    here = Path.cwd().resolve()
    if out == here or out in here.parents:  # renamed away under the shell that stands in it
        raise UsageError(f"{out_dir} is the current folder or holds it: export into a folder below it")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise UsageError(f"{out_dir} exists and is not empty: choose another DIR, or add --overwrite to replace it")
    others = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_NAMES and p.suffix != ".onnx")
    if not _written_by_export(out) or others:
        held = f" ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})" if others else ""
        raise UsageError(
            f"{out_dir} holds files that are not a charlm export's{held}: --overwrite replaces only an earlier "
            "export, never other files; choose another DIR"
        )


def export_path(out_dir: str | Path) -> Path:
    """DIR as the folder it names: absolute, ".." and symlinks resolved (a link to an export replaces the export and
    keeps the link)."""
    return Path(out_dir).resolve()


# What an export folder may hold: these, and graphs (*.onnx); anything else is the user's and never replaced.
EXPORT_NAMES = {WEIGHTS, CONFIG, VOCAB, CARD, *PAGE_FILES, BUNDLED.rstrip("/")}


def _written_by_export(folder: Path) -> bool:
    """An export's folder, safetensors or ONNX: its config.json names a charlm export format."""
    return (export_format(folder) or "").startswith("charlm-")


def export_folder(out_dir: Path) -> Path:
    """A temp folder beside DIR to write the export into, renamed into place (move_into_place) once complete."""
    try:
        return folder_beside(export_path(out_dir))
    except OSError as e:
        raise UsageError(f"cannot create export folder {out_dir}: {folder_problem(out_dir.parent, e)}") from None


def move_into_place(temp: Path, out_dir: Path) -> None:
    """The finished export renamed to DIR (an earlier one there replaced whole), or one line saying why not."""
    try:
        replace_folder(temp, export_path(out_dir))
    except OSError as e:
        raise UsageError(
            f"cannot put the export in place at {out_dir}: {e.strerror} (a mount point or another file system? "
            "export into a new folder inside it)"
        ) from None


def write_export(ckpt: Checkpoint, out_dir: Path, card: str) -> list[Path]:
    """Write the four files into a temp folder beside out_dir, then rename it into place (an earlier export there,
    refused by check_target unless --overwrite, is replaced whole); returns their paths."""
    st = _safetensors()
    # Clones: a tied head shares the embedding's storage, which safetensors refuses to write twice.
    weights = {k: v.detach().to("cpu").clone().contiguous() for k, v in ckpt.state["model"].items()}
    meta = {"format": EXPORT_FORMAT, "charlm_version": __version__, "step": str(ckpt.step)}
    config: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "charlm_version": __version__,
        "step": ckpt.step,
        **ckpt.config.to_dict(),
    }
    config["data"]["path"] = data_name(ckpt)  # the file's name: a published model must not carry a home directory
    files = {
        WEIGHTS: st.save(weights, metadata=meta),
        CONFIG: (json.dumps(config, indent=2) + "\n").encode(),
        VOCAB: (ckpt.tokenizer.to_json() + "\n").encode(),
        CARD: card.encode(),
    }
    temp = export_folder(out_dir)
    try:
        for name, data in files.items():
            atomic_write(temp / name, lambda f, data=data: f.write(data))  # on disk before the folder is renamed
        move_into_place(temp, out_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return [out_dir / name for name in files]


def read_export(folder: Path) -> Checkpoint:
    """An export as a Checkpoint (weights, config, vocabulary); JSON and safetensors only, nothing unpickled."""
    if missing := [name for name in (WEIGHTS, CONFIG, VOCAB) if not (folder / name).is_file()]:
        raise lacks("export", folder, missing)
    st = _safetensors()
    try:
        raw = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        kind = raw.get("data", {}).get("tokenizer", "char") if isinstance(raw, dict) else "char"
        data = raw.get("data", {}) if isinstance(raw, dict) else {}
        separator, columns = data.get("feature_separator", ";"), data.get("columns", "source-target")
        tokenizer = tokenizer_from_json(kind, (folder / VOCAB).read_text(encoding="utf-8"), separator, columns)
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(f"export {folder} is damaged: {CONFIG} or {VOCAB} cannot be read ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != EXPORT_FORMAT:
        raise UsageError(f"{folder / CONFIG} is not a charlm export config (format {EXPORT_FORMAT} expected)")
    step = raw.get("step", 0)
    sections = {k: v for k, v in raw.items() if k in ("data", "model", "train", "sample")}
    try:
        config = config_from_dict(sections, str(folder / CONFIG))
        weights = st.load_file(str(folder / WEIGHTS))
    except UsageError as e:
        raise UsageError(f"export {folder} holds an invalid config: {e}") from None
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise UsageError(f"export {folder} is damaged: {WEIGHTS} cannot be read ({type(e).__name__})") from None
    return Checkpoint(folder, config, tokenizer, {"model": weights, "step": step})


def data_name(ckpt: Checkpoint) -> str:
    """The training data as an export records it: its file (or folder) name, never the path on the trainer's disk."""
    return Path(ckpt.config.data.path).name


# What every model card says of the files beside it (model_card lays out the rest from the family's CardFacts).
FILES = (
    f"Files: `{WEIGHTS}` (weights only, safetensors), `{CONFIG}` (the configuration it was trained with),\n"
    f"`{VOCAB}` (the characters, in id order). Loading never unpickles anything."
)
