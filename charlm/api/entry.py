"""charlm.load, charlm.export and charlm.train, the API's front doors: every kind of model a path opens (a checkpoint,
a run folder, an ONNX export folder), every export format, and a training run from Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from charlm.api.model import Model
from charlm.api.onnx_model import export_onnx, load_onnx
from charlm.errors import UsageError
from charlm.storage.loading import load_model_file, model_path


def load(path: str | Path, device: str = "auto", precision: str = "float32") -> Model:
    """A checkpoint file (or a run folder: its best.pt) as a Model on `device` (auto: cuda, then mps, then cpu); an
    ONNX export folder as a model run by onnxruntime (charlm.api.onnx_model).

    precision="int8" stores the blocks' weight matrices as int8 for decoding on the CPU (about 3x faster batch-1
    sampling of a 6 x 384 model whose float32 weights outgrow the cache); the output head, and layers whose input
    width is not a multiple of 16, stay float32; the text can differ from float32's (charlm.models.quantize)."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise UsageError(f"path must name a checkpoint, a run folder or an export, got {path!r}")
    if (model := load_onnx(model_path(path), device, precision)) is not None:  # an ONNX export folder
        return model
    return Model.from_checkpoint(load_model_file(path), device, precision)


def export(
    checkpoint: str | Path,
    out_dir: str | Path,
    format: str = "safetensors",
    web: bool = False,
    runtime: str | Path | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """Write an export to out_dir: safetensors (model.safetensors), or ONNX (its graphs, checked against the torch
    model: charlm.api.onnx_model.export_onnx), with config.json, vocab.json and a README.md model card; `web` adds a
    page that generates in the browser (docs/export.md). A folder that is not empty is refused unless `overwrite`, which
    replaces only an earlier export."""
    if web and format == "safetensors":
        format = "onnx"  # the page runs the ONNX graphs
    if format == "onnx":
        return export_onnx(checkpoint, out_dir, web, runtime, overwrite).files
    if format != "safetensors":
        raise UsageError(f"--format must be one of safetensors, onnx; got {format!r}")
    if runtime is not None:
        raise UsageError("--runtime bundles onnxruntime-web with a web page: add --web")
    from charlm.storage.export import FILES, check_target, write_export
    from charlm.storage.model_card import model_card

    out = Path(out_dir)
    check_target(out, overwrite)
    ckpt = load_model_file(checkpoint)
    model = Model.from_checkpoint(ckpt, "cpu")
    return write_export(ckpt, out, model_card(model.family.card_facts(model, ckpt.step), out, FILES))


def train(
    config: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    data: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    init_from: str | Path | None = None,
    extend_vocab: bool = False,
    budget: str | None = None,
    speed: float | str | None = None,
) -> dict[str, Any]:
    """Train like `charlm train` and return its summary (the fields of `train --json`). Without a `config` and a
    limit (`train.max_seconds` or `train.max_steps` in `overrides`), like the command, the budget rule's pick for
    100 s on this machine (configs/cpu.yaml's recipe on the CPU the rule was measured on).

    `init_from` fine-tunes: the run starts from that checkpoint's, run folder's or export's weights, shape and
    vocabulary (`extend_vocab` adds the new text's unseen characters instead of refusing them). `budget` ("10m",
    "1h") is `charlm train --budget`: the model and learning rates for that time and the corpus, overrides kept;
    `speed` (26000 or "26k": the reference model's training characters a second here) spares measuring it.

    `overrides` maps dotted keys to values ({"train.max_steps": 200}). Ctrl-C (KeyboardInterrupt) stops the run
    after saving last.pt and propagates; no signal handler is installed and the process is never exited.
    """
    from charlm.training.run import resolve_run

    if not isinstance(overrides, (dict, type(None))) or not all(isinstance(k, str) for k in overrides or {}):
        raise UsageError(f'overrides must map dotted keys to values ({{"train.max_steps": 200}}), got {overrides!r}')
    if out_dir is not None and not isinstance(out_dir, (str, Path)):
        raise UsageError(f"out_dir must be a folder's path (a str or a Path), got {out_dir!r}")
    if budget is not None and not isinstance(budget, str):
        raise UsageError(f'budget must be a duration string such as "10m" or "90s", got {budget!r}')
    if resume and overwrite:
        raise UsageError("resume and overwrite contradict each other: resume continues the run, overwrite replaces it")
    options = {key: (key, value) for key, value in (overrides or {}).items()}  # typed values, no YAML round trip
    options["data.path"] = ("data", None if data is None else str(data))
    request = resolve_run(
        None if config is None else str(config), [], options, out_dir, resume=resume, overwrite=overwrite,
        init_from=init_from, extend_vocab=extend_vocab, budget=budget, speed=None if speed is None else str(speed),
    )  # fmt: skip
    summary = request.run(quiet=quiet)
    return summary.to_dict() if summary is not None else {}
