"""`charlm sweep SPEC`: its flags, the trials' progress lines, the ranked table and the exit codes; the search itself
is charlm.training.sweep's (no ML logic here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from charlm.cli.support import folder, needs_torch, print_json, remover_if_created
from charlm.config.sources import CONFIG_DIRS
from charlm.errors import Interrupted, shell_path
from charlm.training.sweep_folder import BEST_FILE, RESULTS_FILE, STUDY_FILE


def _shipped_specs() -> str:
    """The specs in configs/sweeps, for --help (without importing the training code, which brings torch)."""
    for configs in CONFIG_DIRS:
        if (configs / "sweeps").is_dir():
            return ", ".join(sorted(p.stem for p in (configs / "sweeps").glob("*.yaml")))
    return "none found"


def sweep(
    spec: Annotated[
        Path,
        typer.Argument(
            help=f"The sweep's YAML spec (docs/sweeps.md), or a shipped one's name ({_shipped_specs()}).",
            show_default=False,
        ),
    ],
    out_dir: Annotated[
        Optional[Path],
        typer.Option(
            parser=folder,
            help=f"Sweep folder: {STUDY_FILE}, a run folder per trial, {RESULTS_FILE}, {BEST_FILE}. Default: "
            "runs/<spec name>. "
            "The same command again goes on where a stopped or killed sweep left off.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help=f"Print {RESULTS_FILE} as one JSON object: every counted trial ranked, with its values, full-val "
            f"loss, state and folder; the best one and {BEST_FILE}'s path.",
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress lines or bars while the trials run.")
    ] = False,
) -> None:
    """Search --set keys over trials of one budget each (grid, random or TPE, pruning); rank them by full-val loss.

    One trial runs at a time (several at once are not supported: see docs/sweeps.md). Needs pip install -e
    ".\\[sweep]"; each trial is a normal run folder that `charlm eval`, `sample` and `plot` take, and `charlm plot
    SWEEP_DIR` draws the loss against each swept key.
    """
    needs_torch()
    from charlm.cli.signals import StopSignals
    from charlm.progress import stderr_console
    from charlm.storage.checkpoint import RUNS_DIR
    from charlm.training.sweep import require_optuna, run_sweep
    from charlm.training.sweep_spec import load_spec

    loaded = load_spec(spec)  # every mistake in the spec before anything is written
    require_optuna()
    folder = out_dir if out_dir is not None else RUNS_DIR / spec.stem
    console = stderr_console()

    def say(message: str) -> None:
        if not quiet:
            console.print(message, markup=False)

    with StopSignals(before_exit=remover_if_created(folder)) as stop:
        try:
            results = run_sweep(loaded, folder, stop=stop, say=say, quiet=quiet)
        except Interrupted as e:
            again = f"charlm sweep {spec}" + (f" --out-dir {out_dir}" if out_dir is not None else "")
            raise Interrupted(f"{e}; go on with the same command: {again}", e.signum, saved=e.saved) from None
    if json_out:
        print_json(results)
    else:
        print_sweep(results)


def print_sweep(results: dict[str, Any]) -> None:
    """The trials ranked, best first, with the best config's path."""
    from charlm.progress import stdout_console

    keys = [p["key"] for p in results["swept"]]
    table = Table(
        title=f"sweep {results['sweep_dir']}: {_counted(results['trials_counted'], results['trials_wanted'])}"
    )
    for name in ("rank", "trial", "state", "full-val", "val", "steps", "wall s", *keys):
        table.add_column(name, justify="left" if name in ("trial", "state") else "right")
    for row in results["trials"]:
        state = row["state"] if not row.get("error") else f"failed: {row['error']}"
        table.add_row(
            str(row["rank"]),
            escape(Path(row["folder"]).name),
            escape(state),
            _figure(row["full_val_loss"]),
            _figure(row["val_loss"]),
            "" if row["steps"] is None else f"{row['steps']:,}",
            "" if row["wall_s"] is None else f"{row['wall_s']:.1f}",
            *(escape(_value(row["params"].get(k))) for k in keys),
        )
    out = stdout_console()
    if not out.is_terminal:  # a pipe or a log file gets every column whole
        out.width = max(out.width, 200)
    out.print(table)
    best = results["best"]
    if best is not None:
        out.print(
            f"best: {best['folder']} (full-val {best['full_val_loss']:.4f}); its config: "
            f"charlm train --config {shell_path(results['best_config'])}",
            markup=False,
        )


def _figure(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _counted(counted: int, wanted: int) -> str:
    """How many trials ran, against the spec's trials: more, where the spec asks for fewer than an earlier one did."""
    if counted > wanted:
        return f"{counted} trials (the spec now asks for {wanted}: none run, none dropped)"
    return f"{counted} of {wanted} trials"
