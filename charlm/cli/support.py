"""What every `charlm` command shares: option types with their choices, finding the checkpoint, printing JSON, and
the entry point that turns each failure into one line on stderr and an exit code. No ML logic."""

from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional, cast

import typer
from rich.markup import escape

from charlm.config.checks import DEVICE_NAMES  # no torch behind it: --help stays fast
from charlm.config.sources import shipped_config_names
from charlm.errors import USAGE_EXIT, CharlmError, Interrupted, UsageError

CHECKPOINT_HELP = "Checkpoint file, run folder (its best.pt) or export. Default: the newest runs/*/best.pt."
REPLACE_HELP = (
    "Character used by --unknown replace. Default: the unknown symbol of an encoder-decoder trained with "
    "data.unknown_dropout, else a space, else the model's first character."
)


class State:
    debug = False


# Fixed choices as Enums: --help lists them and the shell completes them.
class BuiltinCorpus(str, Enum):
    """The built-in corpora (charlm.data.download.CORPORA; a test keeps the two in step)."""

    tinyshakespeare = "tinyshakespeare"
    enwik8 = "enwik8"
    text8 = "text8"
    cmudict = "cmudict"
    cmudict_stress = "cmudict-stress"


class Split(str, Enum):
    val = "val"
    test = "test"
    train = "train"
    all = "all"


Unknown = Enum("Unknown", {"error": "error", "skip": "skip", "replace": "replace"}, type=str)  # .replace: a str method


DEVICES = ("auto", "cpu", "cuda", "mps")
DEVICE_HELP = f"{DEVICE_NAMES}."


def complete_device(incomplete: str) -> list[str]:
    return [d for d in DEVICES if d.startswith(incomplete)]


def folder(value: str) -> Path:
    """--out-dir's parser (its values show as <folder>): an empty value, most often an unset shell variable, would
    otherwise become the current folder."""
    if not value.strip():
        raise typer.BadParameter("is empty: name a folder (an empty value is often an unset shell variable)")
    return Path(value)


def _config_given(value: Optional[str]) -> Optional[str]:
    if value is not None and not value.strip():  # `config or the default` would quietly take the default
        raise typer.BadParameter("is empty: name a config file or a shipped config (an unset shell variable?)")
    return value


ConfigOption = Annotated[
    Optional[str],
    typer.Option(
        "--config",
        "-c",
        callback=_config_given,
        help=f"YAML config file, or a shipped config's name ({', '.join(shipped_config_names())}). Default: cpu.",
    ),
]
SetOption = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override one key: section.key=value (repeatable), e.g. --set train.lr=3e-4."),
]
DeviceOption = Annotated[str, typer.Option(help=DEVICE_HELP, autocompletion=complete_device)]


class Precision(str, Enum):
    """The weights' precision when a model is used (charlm.models.quantize); training precision is train.dtype."""

    float32 = "float32"
    int8 = "int8"


PrecisionOption = Annotated[
    Precision,
    typer.Option(
        help="Weights for decoding: int8 samples a large model several times faster on the CPU (the text can "
        "differ from float32's after a while; docs/benchmarks.md gives the agreement)."
    ),
]


def needs_torch() -> None:
    """Commands that run a model check torch first; --help, config and download never import it."""
    from charlm.hardware.device import require_torch

    require_torch()


def checkpoint_path(given: Optional[str]) -> Path:
    """The checkpoint given (a file or a run folder), else the newest run's best.pt, said on stderr."""
    from charlm.progress import stderr_console
    from charlm.storage.checkpoint import newest_checkpoint
    from charlm.storage.loading import model_path

    if given is not None:
        return model_path(given)
    path = newest_checkpoint()
    stderr_console().print(f"using {path} (newest run)", markup=False)
    return path


EnsembleOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--ensemble",
        help="Encoder-decoder: another checkpoint, run folder or export of the same vocabulary that decodes with "
        "the model, their log-probabilities averaged (repeat the option for more).",
        show_default=False,
    ),
]


def load_ensemble(model: Any, given: Optional[list[str]], device: str, precision: str) -> list[Any]:
    """The models --ensemble names, loaded as the model was; said on stderr. Only an encoder-decoder takes them."""
    if not given:
        return []
    from charlm.api.entry import load
    from charlm.progress import stderr_console
    from charlm.storage.loading import model_path

    if not model.family.rewrites_sources:
        raise model.family.refuse(model, "an encoder-decoder (--ensemble decodes with several of them)")
    members = [load(model_path(path), device, precision) for path in given]
    model.rewriter(members)  # each member checked (family, runtime, vocabulary, context) before any work
    names = ", ".join(str(m.path) for m in [model, *members])
    stderr_console().print(f"an ensemble of {len(members) + 1} models: {names}", markup=False)
    return members


def print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def remover_if_created(folder: Path):
    """Removes `folder` if this command created it and it is still empty (for an exit before training starts)."""
    existed = folder.exists()

    def remove() -> None:
        if not existed and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()

    return remove


def check_replacement(replace_with: Optional[str]) -> None:
    if replace_with is not None and len(replace_with) != 1:
        raise UsageError(f"--replace-with takes one character, got {replace_with!r}")


def write_flushed(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def pick_indices(flag: str, chosen: Optional[list[int]], count: int) -> list[int]:
    bad = [i for i in chosen or [] if not 0 <= i < count]
    if bad:
        raise UsageError(f"{flag} {bad[0]} does not exist: the model has {count} (0 to {count - 1})")
    return list(dict.fromkeys(chosen)) if chosen else list(range(count))


@functools.cache
def click_command(app: typer.Typer) -> Any:
    """The click command group typer builds from the app, built once (tens of milliseconds, as it reads every
    command's signature) for each process that runs the CLI more than once: a notebook, the test suite."""
    return typer.main.get_command(app)


def quicker_collector() -> None:
    """The garbage collector set for a command's process: importing torch builds a few million objects that live
    until the process ends, and at CPython's default thresholds the collector walks them again and again while they
    are imported (~0.4 s of a 2-core CPU) and once more at exit (~0.8 s). Collections still happen, less often (the
    youngest generation's at 20,000 new objects instead of 700); at exit, the exit handlers registered after this one
    (atexit runs them last in, first out) run first, and what is still alive is then left to the operating system,
    as CPython does with what outlives its last collection: every file charlm writes is closed, and renamed into
    place, before."""
    gc.set_threshold(20_000, 10, 10)
    atexit.register(gc.freeze)


def run_app(app: typer.Typer, argv: list[str] | None = None) -> None:
    """Run the CLI: one clear line on stderr and an exit code for every failure; a traceback only with --debug."""
    from charlm.progress import stderr_console

    console = stderr_console()
    signal.signal(signal.SIGTERM, _terminated)  # training installs its own handler; this covers start-up
    try:
        code = click_command(app)(args=argv, prog_name="charlm", standalone_mode=False)
    except typer.Abort:
        console.print("[red]interrupted[/red]")
        code = 130
    except CharlmError as e:
        if isinstance(e, Interrupted):  # leaving anyway: a repeated Ctrl-C must not kill us mid-exit
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
        if State.debug:
            raise
        console.print(f"[red]error:[/red] {escape(str(e))}")
        for line in e.details:
            console.print(f"  - {line}", markup=False)
        code = e.exit_code
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]")
        code = 130
    except Exception as e:
        if _is_click_usage_error(e):  # bad flag or argument, as the parser found it
            ctx = getattr(e, "ctx", None)
            where = ctx.command_path if ctx else "charlm"
            message = cast(Any, e).format_message()  # click's UsageError (typer may bundle its own click)
            console.print(f"[red]error:[/red] {escape(message)} (see '{where} --help')")
            code = USAGE_EXIT
        elif State.debug:
            raise
        else:
            console.print(
                f"[red]internal error:[/red] {escape(f'{type(e).__name__}: {e}')} "
                "(rerun with --debug for the traceback)"
            )
            code = 1
    _exit(code or 0)


def _exit(code: int) -> None:
    """Leave with `code`. Under torchrun, without the interpreter's shutdown: gloo's worker threads outlive
    destroy_process_group once a model was wrapped in DDP, and one freeing a finished collective's tensors during
    shutdown (it needs the GIL) aborts the rank with `terminate called without an active exception`."""
    if "torch" in sys.modules:
        from charlm.hardware.distributed import under_torchrun

        if under_torchrun():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


def _terminated(signum: int, frame: object) -> None:
    # Training installs its own handler once it starts; every other command writes through temp files and renames
    raise Interrupted("SIGTERM received: stopped; no file was left half-written", signum)


def _is_click_usage_error(e: Exception) -> bool:
    # typer >= 0.26 vendors click, so match the class by name rather than import one of two copies
    return any(cls.__name__ == "UsageError" for cls in type(e).__mro__) and hasattr(e, "format_message")
