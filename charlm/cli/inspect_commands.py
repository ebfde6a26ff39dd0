"""The `charlm` commands that look at a model or at settings: info, attention, export, plot, config (registered on
the app in charlm/cli/app.py; like it, parsing and messages only)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from charlm.cli.plot import IMAGE_HELP
from charlm.cli.support import (
    CHECKPOINT_HELP,
    ConfigOption,
    SetOption,
    checkpoint_path,
    needs_torch,
    pick_indices,
    print_json,
)
from charlm.errors import UsageError, shell_path


class Part(str, Enum):
    """Which attention of an encoder-decoder `charlm attention` shows."""

    cross = "cross"
    encoder = "encoder"
    decoder = "decoder"


def info(
    checkpoint: Annotated[
        Optional[str],
        typer.Argument(
            help="Checkpoint file, run folder (its best.pt) or export. Default: --config if given, else the newest "
            "runs/*/best.pt, else the cpu config.",
            show_default=False,
        ),
    ] = None,
    config: ConfigOption = None,
    set_: SetOption = None,
    vocab_size: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            help="Vocabulary size with --config. Default: 65 (tiny-shakespeare's), 256 for a byte tokenizer.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (total_params, flops_per_token, components).")
    ] = False,
) -> None:
    """Parameters per component and training FLOPs per token, each beside its formula."""
    needs_torch()
    from charlm.cli.report import print_model_info
    from charlm.config import schema as cfg
    from charlm.config.build import load_config
    from charlm.families.registry import model_info
    from charlm.storage.checkpoint import run_checkpoints
    from charlm.storage.loading import load_model_file

    if checkpoint is not None and (config is not None or set_ or vocab_size is not None):
        raise UsageError("give a checkpoint or --config/--set/--vocab-size, not both (a checkpoint has its vocabulary)")
    by_config = config is not None or set_ or vocab_size is not None
    if checkpoint is None and not by_config and run_checkpoints():
        checkpoint = str(checkpoint_path(None))
    if checkpoint is not None:
        ckpt = load_model_file(checkpoint)
        ckpt.build_model()  # the same checks as eval and sample: shapes, vocabulary, finite weights
        model_config, vocab, title = ckpt.config.model, ckpt.tokenizer.vocab_size, str(ckpt.path)
    else:
        loaded = load_config(config or cfg.DEFAULT_CONFIG, set_ or [])
        model_config = loaded.model
        if loaded.data.tokenizer == "byte" and vocab_size not in (None, 256):
            raise UsageError(f"--vocab-size {vocab_size}: a byte tokenizer's vocabulary is 256; leave --vocab-size out")
        vocab = vocab_size or (256 if loaded.data.tokenizer == "byte" else 65)
        title = f"{config or cfg.DEFAULT_CONFIG} (vocabulary {vocab})"
    result = model_info(model_config, vocab)
    if json_out:
        print_json(result.to_dict())
    else:
        print_model_info(result, title)


# ---------------------------------------------------------------------------- attention

DEFAULT_ATTENTION_PROMPT = "ROMEO: "  # a speaker's name as tiny-shakespeare writes it


def attention(
    checkpoint: Annotated[Optional[str], typer.Argument(help=CHECKPOINT_HELP, show_default=False)] = None,
    prompt: Annotated[
        Optional[str],
        typer.Option(
            help=f"Text to look at (at most the model's context length). Default: {DEFAULT_ATTENTION_PROMPT!r}.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help=IMAGE_HELP)] = Path("attention.png"),
    layer: Annotated[
        Optional[list[int]], typer.Option(help="Layer to show (repeatable; 0-based). Default: all.")
    ] = None,
    head: Annotated[Optional[list[int]], typer.Option(help="Head to show (repeatable; 0-based). Default: all.")] = None,
    part: Annotated[
        Optional[Part],
        typer.Option(
            help="Encoder-decoder: cross (target characters down, source across: the alignment), encoder or "
            "decoder self-attention. Default: cross.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print {"chars": [...], "layers": [...], "heads": [...], "weights": layers x heads x T x T} '
            '(an encoder-decoder adds "part", "source", "target" and "key_chars") instead of drawing.',
        ),
    ] = False,
) -> None:
    """Attention maps: one heatmap per layer and head, the prompt's characters along both axes.

    For an encoder-decoder the prompt is a source: its greedy target is decoded, then --part picks the map.
    """
    needs_torch()
    from charlm.api.entry import load
    from charlm.cli.plot import check_image_target

    if not json_out:
        check_image_target(output)
    model = load(checkpoint_path(checkpoint), "cpu")
    given, prompt = prompt is not None, DEFAULT_ATTENTION_PROMPT if prompt is None else prompt
    features = model.tokenizer.features is not None  # SOURCE<TAB>FEATURES: checked as the source is encoded
    if not features and (unseen := model.tokenizer.unknown_chars(prompt)):  # a map shows the model's own inputs
        shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unseen[:10])
        if not given:
            raise UsageError(
                f"the default --prompt {prompt!r} has characters not in {model.path}'s vocabulary ({shown}); pass "
                "--prompt with a text in the model's characters"
            )
        raise UsageError(f"--prompt has characters not in the model's vocabulary: {shown}; leave them out")
    if model.family.rewrites_sources:  # three maps: encoder, decoder and cross-attention
        return _transduction_attention(model, prompt, output, layer, head, (part or Part.cross).value, json_out)
    if part is not None:
        raise UsageError("--part is for encoder-decoder models (a decoder has one self-attention)")
    weights = model.attention(prompt)  # (L, nh, T, T)
    layers = pick_indices("--layer", layer, weights.size(0))
    heads = pick_indices("--head", head, weights.size(1))
    chars = [model.tokenizer.decode([i]) for i in model.encode_prompt(prompt)]
    if json_out:
        picked = weights[layers][:, heads]
        print_json({"chars": chars, "layers": layers, "heads": heads, "weights": picked.tolist()})
        return
    from charlm.cli.plot import plot_attention
    from charlm.progress import stderr_console

    plot_attention(weights, chars, layers, heads, output, f"attention of {model.path} on {prompt!r}")
    stderr_console().print(
        f"wrote {output} ({len(layers)} layers x {len(heads)} heads, {len(chars)} characters)", markup=False
    )


def _transduction_attention(model, source: str, output: Path, layer, head, part: str, json_out: bool) -> None:
    from charlm.cli.plot import plot_attention
    from charlm.progress import stderr_console

    maps = model.transduction_attention(source)
    if part not in maps:
        raise UsageError(
            f"this model has no {part} attention (model.cross_attention is off): use --part encoder|decoder"
        )
    weights = maps[part]  # (L, nh, rows, columns)
    layers = pick_indices("--layer", layer, weights.size(0))
    heads = pick_indices("--head", head, weights.size(1))
    rows = maps["source"] if part == "encoder" else maps["target"]
    columns = ["⟨start⟩", *maps["target"][:-1]] if part == "decoder" else maps["source"]  # the decoder's inputs
    if json_out:
        picked = weights[layers][:, heads].tolist()
        shown = {"chars": rows, "key_chars": columns, "source": maps["source"], "target": maps["target"]}
        print_json({"part": part, **shown, "layers": layers, "heads": heads, "weights": picked})
        return
    target = "".join(maps["target"][:-1])
    title = f"{part} attention of {model.path}: {source!r} -> {target!r}"
    named = {
        "cross": ("target: the character written", "source character (attends to)"),
        "encoder": ("source (attends from)", "source (attends to)"),
        "decoder": ("target: the character written", "target so far (attends to)"),
    }[part]
    plot_attention(weights, rows, layers, heads, output, title, columns, named)
    stderr_console().print(f"wrote {output} ({len(layers)} layers x {len(heads)} heads, {part})", markup=False)


# ---------------------------------------------------------------------------- export


class ExportFormat(str, Enum):
    """What `charlm export` writes."""

    safetensors = "safetensors"
    onnx = "onnx"


def export_(
    paths: Annotated[
        list[str],
        typer.Argument(
            metavar="[CKPT] DIR",
            show_default=False,
            help="Checkpoint file, run folder (its best.pt) or export (default: the newest runs/*/best.pt), then the "
            "folder to write.",
        ),
    ],
    format_: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="safetensors: weights for charlm and torch; onnx: graphs for onnxruntime (the decoder's step with "
            "its KV cache), checked against the model before they are written (needs the onnx extra).",
        ),
    ] = ExportFormat.safetensors,
    web: Annotated[
        bool,
        typer.Option(
            "--web",
            help="ONNX, plus a static web page (index.html) that generates text in the browser with "
            "onnxruntime-web; any static file server can host the folder.",
        ),
    ] = False,
    runtime: Annotated[
        Optional[Path],
        typer.Option(
            help="With --web: bundle onnxruntime-web from this folder (node_modules/onnxruntime-web/dist of an npm "
            "install) instead of loading it from jsdelivr, for offline hosting.",
            show_default=False,
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an earlier export in DIR (never other files).")
    ] = False,
) -> None:
    """Write a model anyone can run without charlm's pickles: safetensors, ONNX graphs or a web page.

    Beside the weights or graphs: config.json, vocab.json and a README.md model card.

    --format onnx checks the graphs through onnxruntime before writing: logits within 1e-4, the same greedy text.

    --web adds index.html, a page that generates in the browser. DIR must be empty unless --overwrite.
    """
    needs_torch()
    from charlm.api.entry import export
    from charlm.api.onnx_model import export_onnx
    from charlm.progress import stderr_console

    if len(paths) > 2:
        raise UsageError(f"charlm export takes [CKPT] DIR, got {len(paths)} paths")
    from charlm.storage.loading import model_kind

    if len(paths) == 1 and (kind := model_kind(paths[0])):  # DIR forgotten: it would take the newest run instead
        raise UsageError(
            f"DIR is missing: {paths[0]} is {kind}, the model to export; add the folder to write "
            f"(charlm export {shell_path(paths[0])} DIR)"
        )
    source = checkpoint_path(paths[0] if len(paths) == 2 else None)
    console = stderr_console()
    if format_ is ExportFormat.safetensors and not web:
        written = export(source, Path(paths[-1]), runtime=runtime, overwrite=overwrite)
        console.print(f"exported {source} to {paths[-1]}: {', '.join(p.name for p in written)}", markup=False)
        return
    done = export_onnx(source, Path(paths[-1]), web, runtime, overwrite)
    names = sorted({p.name if p.parent.name != "ort" else "ort/" for p in done.files})
    check = done.check
    console.print(
        f"exported {source} to {paths[-1]} in {done.export_seconds:.1f} s: {', '.join(names)}\n"
        f"checked through onnxruntime: {check.compared}, max |difference| {check.max_abs_diff:.2g}; "
        f"{check.greedy} identical to charlm's",
        markup=False,
    )


# ---------------------------------------------------------------------------- plot and config


def plot(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(help="One or more run folders (each with metrics.jsonl), or one sweep folder (charlm sweep)."),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help=IMAGE_HELP)] = Path("loss.png"),
) -> None:
    r"""Plot train and val loss against step and wall time, with the learning rate (needs pip install -e ".\[plot]").

    Given a sweep folder, plots each trial's full-validation loss against each swept key instead.
    """
    # \[ above: rich markup would read [plot] as a style and drop it
    from charlm.cli.plot import check_image_target, plot_runs, plot_sweep, sweep_results
    from charlm.progress import stderr_console

    check_image_target(output)
    sweeps = [(d, found) for d in run_dirs if (found := sweep_results(d)) is not None]
    if sweeps and len(run_dirs) > 1:
        raise UsageError(f"{sweeps[0][0]} is a sweep folder: plot it alone (charlm plot {shell_path(sweeps[0][0])})")
    written = plot_sweep(sweeps[0][1], output) if sweeps else plot_runs(run_dirs, output)
    stderr_console().print(f"wrote {written}")


def config_(
    config: ConfigOption = None,
    set_: SetOption = None,
    show: Annotated[
        bool, typer.Option("--show", help="Print the resolved configuration as YAML (the default).")
    ] = False,
    keys: Annotated[bool, typer.Option("--keys", help="List every key with its type, default and meaning.")] = False,
) -> None:
    """Print the configuration a `charlm train` with the same --config/--set would use, and where each key came from.

    Every key, resolved, as YAML: after each, the built-in default, the config file or the --set that gave its value.
    """
    from charlm.config import schema as cfg

    if keys:
        if show or config is not None or set_:
            raise UsageError("--keys lists every key with its default; it takes no --show, --config or --set")
        from charlm.cli.report import print_config_keys
        from charlm.config.reference import key_reference

        print_config_keys(key_reference())
        return
    from charlm.config.origins import annotated_yaml, chain_names, key_origins

    name = config or cfg.DEFAULT_CONFIG
    resolved, origins = key_origins(name, set_ or [])
    sys.stdout.write(annotated_yaml(resolved, origins, chain_names(name)))
