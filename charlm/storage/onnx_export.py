"""ONNX exports (`charlm export --format onnx`): each graph of the family traced by torch.onnx's dynamo exporter,
checked against the torch model through onnxruntime before anything is kept, written with config.json, vocab.json
and the model card into a temp folder beside DIR that is then renamed into place (docs/export.md)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from charlm.config.build import config_from_dict
from charlm.config.schema import Config
from charlm.data.tokenizer import Tokenizer, tokenizer_from_json
from charlm.decoding.steps import RuntimeCheck
from charlm.errors import UsageError, WorkError
from charlm.families.base import Family, Loaded
from charlm.models.decoder import decoder_reach, relative_positions
from charlm.models.onnx_graphs import Graph
from charlm.storage.checkpoint import Checkpoint
from charlm.storage.export import CONFIG, VOCAB, check_target, data_name, export_folder, lacks, move_into_place
from charlm.storage.onnx_runtime import ONNX_HINT, OnnxRuntime
from charlm.version import __version__

ONNX_FORMAT = "charlm-onnx-1"
EXPORT_AGAIN = "charlm export CKPT DIR --format onnx"
OPSET = 18  # LayerNormalization is in the standard set from 17; 18 is the dynamo exporter's own, onnxruntime-web's too
TOLERANCE = 1e-4  # the largest logit difference from the torch model that an export may have (float32)


@dataclass
class OnnxExport:
    """An ONNX export folder as read back: its config, vocabulary and graphs in onnxruntime."""

    path: Path
    config: Config
    tokenizer: Tokenizer
    runtime: OnnxRuntime
    step: int


@dataclass
class Written:
    """What `charlm export --format onnx` wrote and how its check went."""

    files: list[Path]
    check: RuntimeCheck
    export_seconds: float


def is_onnx_export(path: Path) -> bool:
    """A folder written by `charlm export --format onnx` (judged by its config.json's format)."""
    try:
        raw = json.loads((path / CONFIG).read_text(encoding="utf-8")) if path.is_dir() else None
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("format") == ONNX_FORMAT


def onnx_modules() -> None:
    """Refuse in one line where the exporter's packages are missing (torch.onnx needs onnx and onnxscript)."""
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            raise UsageError(f"--format onnx needs the {name} package: {ONNX_HINT}") from None


def export_graph(graph: Graph, path: Path, block_size: int) -> None:
    """One graph to one .onnx file (weights inside: onnxruntime-web loads a single file)."""
    from torch.export import Dim

    # Sizes 0 and 1 are specialised by torch.export, so the examples have two rows and time runs from 2: the graph
    # traced computes any length, single steps included.
    dims = {"batch": Dim("batch", min=1, max=4096), "time": Dim("time", min=2), "source": Dim("source", min=2)}
    if "ids" in graph.input_names and "start" not in graph.input_names:  # an encoder's window: its positions' table
        dims["time"] = Dim("time", min=2, max=block_size)
    dims["source"] = Dim("source", min=2, max=block_size)
    shapes = [{a: dims[n] for a, n in graph.dynamic.get(name, {}).items()} or None for name in graph.input_names]
    quiet = io.StringIO()
    exporter_log = logging.getLogger("torch.onnx")  # notes about optional packages (torchvision's operators)
    level = exporter_log.level
    with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        warnings.simplefilter("ignore")
        exporter_log.setLevel(logging.ERROR)
        try:
            torch.onnx.export(
                graph.module.eval(),
                graph.inputs,
                str(path),
                input_names=graph.input_names,
                output_names=graph.output_names,
                dynamic_shapes=tuple(shapes),
                opset_version=OPSET,
                dynamo=True,
                external_data=False,
            )
        except Exception as e:  # the exporter raises many types; the first line of its message names the cause
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise WorkError(f"torch.onnx could not export the {graph.name} graph ({type(e).__name__}: {first})") from e
        finally:
            exporter_log.setLevel(level)


def write_onnx_export(
    ckpt: Checkpoint,
    loaded: Loaded,
    family: Family,
    out_dir: Path,
    card: Callable[[], str],
    overwrite: bool = False,
    extra: Callable[[Path], None] | None = None,
) -> Written:
    """Export, check and write the folder with the model card card() writes; `extra(folder)` adds files (the web
    page) before it is renamed into place. Nothing is left behind when any step fails."""
    onnx_modules()
    check_target(out_dir, overwrite)
    model = loaded.config.model
    if model.n_experts:
        raise UsageError(
            f"model.n_experts={model.n_experts}: a mixture of experts cannot be exported to ONNX (its routing gives "
            "each expert a number of rows known only at run time); use --format safetensors"
        )
    graphs = family.onnx_graphs(loaded.module)  # a family refuses, in one line, what it cannot export
    temp = export_folder(out_dir)  # others may read it (a web host)
    try:
        started = time.perf_counter()
        for graph in graphs:
            export_graph(graph, temp / f"{graph.name}.onnx", model.block_size)
        seconds = time.perf_counter() - started
        runtime = OnnxRuntime({g.name: temp / f"{g.name}.onnx" for g in graphs}, model)
        check = family.onnx_check(loaded, runtime)
        if not check.max_abs_diff <= TOLERANCE:
            raise WorkError(
                f"the ONNX graphs' logits differ from charlm's by up to {check.max_abs_diff:.3g} (tolerance "
                f"{TOLERANCE:g}); nothing was written: export with --format safetensors"
            )
        if check.differs:
            raise WorkError(f"greedy output through onnxruntime differs from charlm's at {check.differs}")
        _write_files(temp, ckpt, graphs, check, card())
        if extra is not None:
            extra(temp)
        move_into_place(temp, out_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return Written(sorted(p for p in out_dir.rglob("*") if p.is_file()), check, seconds)


def _write_files(folder: Path, ckpt: Checkpoint, graphs: list[Graph], check: RuntimeCheck, card: str) -> None:
    m = ckpt.config.model
    config: dict[str, Any] = {"format": ONNX_FORMAT, "charlm_version": __version__, "step": ckpt.step}
    config["onnx"] = {
        "opset": OPSET,
        "exporter": f"torch.onnx dynamo (torch {torch.__version__.split('+')[0]})",
        "graphs": {
            g.name: {"file": f"{g.name}.onnx", "inputs": g.input_names, "outputs": g.output_names} for g in graphs
        },
        "state": "keys and values (layers, batch, heads, block_size slots, head size), position p in slot p % "
        "block_size; the position each slot holds (-2^40: none); token shift's last inputs (layers + 1, batch, width)",
        "window": {"relative": relative_positions(m), "reach": decoder_reach(m), "block_size": m.block_size},
        "check": {**asdict(check), "tolerance": TOLERANCE},
    }
    config.update(ckpt.config.to_dict())
    config["data"]["path"] = data_name(ckpt)
    (folder / CONFIG).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / VOCAB).write_text(ckpt.tokenizer.to_json() + "\n", encoding="utf-8")
    (folder / "README.md").write_text(card, encoding="utf-8")


def read_onnx_export(folder: Path, threads: int = 0) -> OnnxExport:
    """An ONNX export's config, vocabulary and graphs (every problem one UsageError line)."""
    if missing := [name for name in (CONFIG, VOCAB) if not (folder / name).is_file()]:
        raise lacks("ONNX export", folder, missing, EXPORT_AGAIN)
    try:
        raw = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        kind = raw.get("data", {}).get("tokenizer", "char")
        data = raw.get("data", {}) if isinstance(raw, dict) else {}
        separator, columns = data.get("feature_separator", ";"), data.get("columns", "source-target")
        tokenizer = tokenizer_from_json(kind, (folder / VOCAB).read_text(encoding="utf-8"), separator, columns)
        graphs = {name: folder / g["file"] for name, g in raw["onnx"]["graphs"].items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        raise UsageError(f"ONNX export {folder} is damaged: {CONFIG} or {VOCAB} cannot be read ({e})") from None
    if missing := [p.name for p in graphs.values() if not p.is_file()]:
        raise lacks("ONNX export", folder, missing, EXPORT_AGAIN)
    sections = {k: v for k, v in raw.items() if k in ("data", "model", "train", "sample")}
    try:
        config = config_from_dict(sections, str(folder / CONFIG))
    except UsageError as e:
        raise UsageError(f"ONNX export {folder} holds an invalid config: {e}") from None
    return OnnxExport(folder, config, tokenizer, OnnxRuntime(graphs, config.model, threads), int(raw.get("step", 0)))


# What the model card of an ONNX export says of the files beside it (model_card lays out the rest).
ONNX_FILES = (
    "Files: `model.onnx` (a decoder's step: new characters and the cache in, logits and the next cache out), or\n"
    "`encoder.onnx` and `decoder.onnx` (an encoder-decoder); `config.json` (the configuration, and how the graphs\n"
    "were checked against charlm's own model), `vocab.json` (the characters, in id order). `charlm sample` and\n"
    "`charlm eval` run the folder through onnxruntime; docs/export.md describes the graphs' inputs and outputs."
)
