"""Loss curves from one or more run folders' metrics.jsonl, and a sweep's loss against each swept key, drawn with
matplotlib (the optional `plot` extra)."""

from __future__ import annotations

import json
from pathlib import Path

from charlm.errors import UsageError
from charlm.files import atomic_write, folder_problem
from charlm.training import sweep_folder

PLOTTED = ("step", "elapsed_s", "train_loss", "val_loss", "lr")  # what each evaluation's line must give a number for


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        what = "is a file, not a run folder" if run_dir.exists() else "not found"
        raise UsageError(f"{run_dir} {what}: give a run folder written by `charlm train` (or a sweep folder)")
    if not path.is_file():
        raise UsageError(f"no metrics in {run_dir}: {path} is missing (give a run folder written by `charlm train`)")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError:
                raise UsageError(f"{path} line {number} is not JSON; the file is damaged") from None
            missing = [k for k in PLOTTED if not isinstance(record, dict) or not _number(record.get(k))]
            if missing:
                raise UsageError(f"{path} line {number} has no number for {missing[0]}; the file is damaged")
            records.append(record)
    if not records:
        raise UsageError(f"{path} holds no evaluations yet; train longer than one eval_interval")
    return records


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


IMAGE_FORMATS = ("png", "pdf", "svg")  # a raster for screens, two vector formats for papers; the ending picks one
IMAGE_HELP = f"Image to write: {', '.join('.' + f for f in IMAGE_FORMATS)} (the name's ending picks the format)."


def check_image_target(output: Path) -> str:
    """The format --output's name asks for; refused, before any work, when it is a folder or ends otherwise (a PNG
    named plot.pdf would not open in a PDF viewer)."""
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder: give the image's file name, e.g. {output / 'plot.png'}")
    kind = output.suffix.lower().lstrip(".")
    if kind not in IMAGE_FORMATS:
        raise UsageError(
            f"--output {output}: name the image with one of the endings {', '.join('.' + f for f in IMAGE_FORMATS)} "
            "(the ending picks the format)"
        )
    return kind


def write_image(fig, output: Path) -> None:
    """The figure at `output` in the format its name ends with, written whole beside it and renamed into place."""
    kind = check_image_target(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create {output.parent} for --output: {folder_problem(output.parent, e)}") from None
    atomic_write(output, lambda f: fig.savefig(f, format=kind, dpi=110))


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(
            'this command draws with matplotlib: pip install -e ".[plot]" in your charlm checkout '
            "(or pip install matplotlib)"
        ) from None
    return plt


def shown_char(c: str) -> str:
    """A character as an axis label: whitespace made visible."""
    return {"\n": "⏎", " ": "·", "\t": "⇥"}.get(c, c)


def plot_attention(
    weights,
    chars: list[str],
    layers: list[int],
    heads: list[int],
    output: Path,
    title: str,
    key_chars: list[str] | None = None,
    axes_named: tuple[str, str] = ("query (attends from)", "key (attends to)"),
) -> Path:
    """A grid of heatmaps, one per (layer, head): query characters down, key characters (default: the same) across."""
    plt = _pyplot()
    key_chars = chars if key_chars is None else key_chars
    T = max(len(chars), len(key_chars))
    cell = max(2.2, min(12.0, 0.14 * T + 1.5))  # inches per heatmap: room for T labels of at least 5 pt
    fig, axes = plt.subplots(
        len(layers), len(heads), figsize=(cell * len(heads), cell * len(layers)), squeeze=False, constrained_layout=True
    )
    labels, key_labels = [shown_char(c) for c in chars], [shown_char(c) for c in key_chars]
    font = max(5, min(9, 360 // max(T, 1)))
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            image = ax.imshow(weights[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(range(len(key_labels)), key_labels, fontsize=font, family="monospace")
            ax.set_yticks(range(len(labels)), labels, fontsize=font, family="monospace")
            ax.tick_params(length=0)
            if c == 0:
                ax.set_ylabel(axes_named[0], fontsize=8)
            if r == len(layers) - 1:
                ax.set_xlabel(axes_named[1], fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=10)
    write_image(fig, output)
    plt.close(fig)
    return output


def plot_runs(run_dirs: list[Path], output: Path) -> Path:
    """Train and val loss against step and against wall time, learning rate on a second axis; one PNG."""
    plt = _pyplot()
    runs = [(d, read_metrics(d)) for d in run_dirs]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    for ax, x_key, x_label in ((axes[0], "step", "step"), (axes[1], "elapsed_s", "wall time (s)")):
        lr_ax = ax.twinx()
        for i, (run_dir, records) in enumerate(runs):
            color = f"C{i}"
            xs = [r[x_key] for r in records]
            ax.plot(
                xs,
                [r["train_loss"] for r in records],
                color=color,
                linestyle="--",
                alpha=0.7,
                label=f"{run_dir.name} train",
            )
            ax.plot(xs, [r["val_loss"] for r in records], color=color, label=f"{run_dir.name} val")
            lr_ax.plot(xs, [r["lr"] for r in records], color=color, linestyle=":", alpha=0.5)
        ax.set_xlabel(x_label)
        ax.set_ylabel("loss (nats/char)")
        lr_ax.set_ylabel("learning rate (dotted)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower left")
    axes[0].set_title("loss against step")
    axes[1].set_title("loss against wall time")
    write_image(fig, output)
    plt.close(fig)
    return output


def sweep_results(folder: Path) -> dict | None:
    """A sweep folder's results.json, or None for a folder that is no sweep."""
    path = folder / sweep_folder.RESULTS_FILE
    if not path.is_file():
        if (folder / sweep_folder.STUDY_FILE).is_file():  # stopped in its first trial: no results yet
            raise UsageError(f"{folder} is a sweep that holds no completed trial yet; run its command again first")
        return None
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise UsageError(f"{path} is not JSON; run the sweep's command again to rewrite it") from None
    return results if isinstance(results, dict) and results.get("kind") == sweep_folder.KIND else None


def plot_sweep(results: dict, output: Path) -> Path:
    """One panel per swept key: each completed trial's full-validation loss against its value (log axis for a
    log-scaled range), pruned trials' last periodic estimate as open circles."""
    plt = _pyplot()
    swept = results["swept"]
    done = [r for r in results["trials"] if r["state"] in ("complete", "pruned")]
    if not any(r["state"] == "complete" for r in done):
        raise UsageError(f"{results['sweep_dir']} holds no completed trial yet; run the sweep first")
    fig, axes = plt.subplots(1, len(swept), figsize=(4.5 * len(swept), 4), squeeze=False, constrained_layout=True)
    for ax, param in zip(axes[0], swept, strict=True):
        key, choices = param["key"], param["choices"]
        labels = [str(c) for c in choices] if choices is not None else []

        def x_of(value, labels=labels, choices=choices):
            return labels.index(str(value)) if choices is not None else value

        for state, marker in (("complete", "o"), ("pruned", "o")):
            rows = [r for r in done if r["state"] == state and key in r["params"]]
            xs = [x_of(r["params"][key]) for r in rows]
            ys = [r["full_val_loss"] if state == "complete" else r["val_loss"] for r in rows]
            face = "C0" if state == "complete" else "none"
            ax.scatter(xs, ys, marker=marker, facecolors=face, edgecolors="C0", label=state)
        if choices is not None:
            ax.set_xticks(range(len(labels)), labels)
        elif param.get("log"):
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel("full-val loss (nats/char)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"sweep {results['sweep_dir']}: loss against each swept key", fontsize=10)
    write_image(fig, output)
    plt.close(fig)
    return output
