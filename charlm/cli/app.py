"""The `charlm` command line: parsing, messages and exit codes only; the work lives in the other modules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from charlm.cli import inspect_commands as cli_inspect
from charlm.cli import items_commands as cli_items
from charlm.cli import sample_commands as cli_sample
from charlm.cli import serve_command as cli_serve
from charlm.cli import sweep_command as cli_sweep
from charlm.cli.support import (
    CHECKPOINT_HELP,
    DEVICE_HELP,
    REPLACE_HELP,
    BuiltinCorpus,
    ConfigOption,
    DeviceOption,
    EnsembleOption,
    Precision,
    PrecisionOption,
    SetOption,
    Split,
    State,
    Unknown,
    check_replacement,
    checkpoint_path,
    complete_device,
    folder,
    load_ensemble,
    needs_torch,
    print_json,
    quicker_collector,
    remover_if_created,
    run_app,
)
from charlm.data.download import MAX_TIMEOUT, MIN_TIMEOUT
from charlm.errors import Interrupted, SaveFailed, UsageError, shell_path
from charlm.version import __version__

if TYPE_CHECKING:
    from charlm.training.run import RunRequest

EXIT_CODES_HELP = "Exit codes: 0 ok, 1 runtime failure, 2 usage or config error, 130/143 interrupted (SIGINT/SIGTERM)."

app = typer.Typer(
    name="charlm",
    help=f"Train, measure and sample character-level Transformer language models.\n\n{EXIT_CODES_HELP}",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"charlm {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the Python traceback when something fails.")] = False,
) -> None:
    State.debug = debug


# ---------------------------------------------------------------------------- download


def _timeout_given(value: float) -> float:
    """--timeout checked as it is parsed: NaN passes click's range check, and inf reached the socket's time_t."""
    from charlm.data.download import timeout_problem

    if problem := timeout_problem(value):
        raise typer.BadParameter(problem)
    return value


@app.command()
def download(
    name: Annotated[
        BuiltinCorpus,
        typer.Argument(
            help="Which corpus: tinyshakespeare (1.1 MB), enwik8 (10^8 bytes of Wikipedia XML), text8 (10^8 cleaned "
            "characters), cmudict (the CMU Pronouncing Dictionary as word<TAB>phonemes lines for data.format pairs: "
            "comments stripped, one line per pronunciation, alternates kept, stress digits stripped: the 39-phoneme "
            "task) or cmudict-stress (the same, stress digits kept); each download's SHA-256 is pinned.",
            show_default=True,
        ),
    ] = BuiltinCorpus.tinyshakespeare,
    url: Annotated[
        Optional[str],
        typer.Option(
            help="http://, https:// or file:// URL of a mirror (it must hold the same bytes) or of another text. "
            "Default: $CHARLM_DATA_URL (tinyshakespeare), $CHARLM_ENWIK8_URL, $CHARLM_TEXT8_URL, $CHARLM_CMUDICT_URL, "
            "else the canonical URL."
        ),
    ] = None,
    dest: Annotated[
        Optional[Path],
        typer.Option(
            help="Where to write the text. Default: data/tinyshakespeare.txt, data/enwik8, data/text8 or "
            "data/cmudict.tsv, data/cmudict-stress.tsv (the .zip or .dict fetched is kept beside it).",
            show_default=False,
        ),
    ] = None,
    sha256: Annotated[
        Optional[str], typer.Option(help="Expected SHA-256 (hex) of another file. Default: the corpus's pinned one.")
    ] = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the SHA-256 check (for other corpora).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Download again even if the file is already there.")] = False,
    retries: Annotated[
        int, typer.Option(min=0, max=10, help="Extra attempts after a transient failure (backoff 1, 2, 4, 8 s).")
    ] = 4,
    timeout: Annotated[
        float,
        typer.Option(
            callback=_timeout_given,
            help=f"Seconds to wait for the server on each attempt ({MIN_TIMEOUT:g} to {MAX_TIMEOUT:g}).",
        ),
    ] = 10.0,
) -> None:
    """Fetch tiny-shakespeare (or enwik8, text8, cmudict), check its pinned SHA-256, unzip or convert; keeps it."""
    from charlm.data import download as dl
    from charlm.progress import DownloadBar, stderr_console

    corpus = dl.builtin_corpus(name.value)
    target = dest or corpus.dest
    with DownloadBar(target.name) as bar:
        result = dl.download_corpus(
            corpus,
            url,
            dest,
            sha256,
            verify=not no_verify,
            force=force,
            retries=retries,
            timeout=timeout,
            progress=bar.update,
        )
    verified = not no_verify
    kept = "already there, verified" if verified else "already there (not verified)"
    what = "downloaded" if result.downloaded else kept
    stderr_console().print(
        f"{result.path}: {what} ({result.bytes:,} bytes, sha256 {result.sha256[:16]}...)", markup=False
    )


# ---------------------------------------------------------------------------- train


@app.command()
def train(
    config: ConfigOption = None,
    set_: SetOption = None,
    data: Annotated[
        Optional[str], typer.Option(help="Text file, or folder of text files, to train on (data.path).")
    ] = None,
    out_dir: Annotated[
        Optional[Path], typer.Option(parser=folder, help="Run folder. Default: runs/<config name>.")
    ] = None,
    device: Annotated[
        Optional[str], typer.Option(help=f"{DEVICE_HELP} (train.device)", autocompletion=complete_device)
    ] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Optimizer steps at most (train.max_steps).")] = None,
    max_seconds: Annotated[
        Optional[float], typer.Option(help="Training time budget in seconds (train.max_seconds).")
    ] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed (train.seed).")] = None,
    budget: Annotated[
        Optional[str],
        typer.Option(
            help="Wall time for the whole run: 300s, 10m, 1h. Picks the model, dropout and learning rates for it "
            "and the corpus's size (docs/training.md); the keys you set are kept. Sets train.max_seconds.",
            show_default=False,
        ),
    ] = None,
    speed: Annotated[
        Optional[str],
        typer.Option(
            help="For the budget rule (--budget, or no --config and no limit): this machine's speed, the 4 x 96 "
            "reference model's training characters a second "
            "(26k, 1.3M: what the first line of a measured run says), instead of measuring it for a few seconds "
            "first (also CHARLM_SPEED).",
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in --out-dir from its last.pt (settings equal to the run's are fine; only "
            "limits and schedule knobs may change).",
        ),
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the run already in --out-dir.")] = False,
    init_from: Annotated[
        Optional[str],
        typer.Option(
            "--init-from",
            help="Fine-tune: start a new run from this checkpoint's, run folder's or export's weights "
            "(its shape and vocabulary; fresh optimizer and schedule).",
            show_default=False,
        ),
    ] = None,
    extend_vocab: Annotated[
        bool,
        typer.Option(
            "--extend-vocab",
            help="With --init-from: give characters the model has never seen new embedding and head "
            "rows instead of refusing the text.",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or evaluation lines.")] = False,
) -> None:
    """Train a model; with no options, what 100 s buy here (configs/cpu.yaml on a 2-core CPU) on tiny-shakespeare.

    Without --config or a limit (--budget, --max-seconds, --max-steps) the run is the budget rule's pick for 100 s on
    this machine: its speed measured first for a few seconds (or given with --speed), configs/cpu.yaml's recipe on a
    2-core CPU, a bigger model on a faster one. tiny-shakespeare is downloaded when missing."""
    needs_torch()
    from charlm.training.run import resolve_run

    _refuse_train_clashes(resume, overwrite, extend_vocab, init_from)
    options = _train_flag_settings(data, device, max_steps, max_seconds, seed)
    request = resolve_run(
        config, set_ or [], options, out_dir, resume=resume, overwrite=overwrite, init_from=init_from,
        extend_vocab=extend_vocab, budget=budget, speed=speed,
    )  # fmt: skip
    _train_and_report(request, quiet, json_out)


def _refuse_train_clashes(resume: bool, overwrite: bool, extend_vocab: bool, init_from: str | None) -> None:
    """Flags that cannot go together, refused before any configuration is read."""
    if resume and overwrite:
        raise UsageError("--resume and --overwrite contradict each other; choose one")
    if extend_vocab and init_from is None:
        raise UsageError("--extend-vocab extends the vocabulary of an --init-from model; add --init-from CKPT")


def _train_flag_settings(
    data: str | None, device: str | None, max_steps: int | None, max_seconds: float | None, seed: int | None
) -> dict[str, tuple[str, Any]]:
    """The config keys `charlm train`'s own flags set, each with the flag that messages name it by."""
    return {
        "data.path": ("--data", data),
        "train.device": ("--device", device),
        "train.max_steps": ("--max-steps", max_steps),
        "train.max_seconds": ("--max-seconds", max_seconds),
        "train.seed": ("--seed", seed),
    }


def _train_and_report(request: RunRequest, quiet: bool, json_out: bool) -> None:
    """The run under the command line's signal handlers, a stop or a full disk told with the command that goes on,
    then its summary printed (by rank 0 alone under torchrun: the other ranks have none)."""
    from charlm.cli.report import print_train_summary
    from charlm.cli.signals import StopSignals
    from charlm.progress import TrainReporter

    with StopSignals(before_exit=remover_if_created(request.out_dir)) as stop:
        try:
            summary = request.run(reporter=TrainReporter(quiet), stop=stop)
        except Interrupted as e:  # the loop says what it saved; how to go on is the command line's to say
            if e.saved is None:
                raise
            hint = f"continue with `charlm train --resume --out-dir {shell_path(request.out_dir)}`"
            raise Interrupted(f"{e}; {hint}", e.signum, saved=e.saved) from None
        except SaveFailed as e:
            todo = f"free some disk space, then `charlm train --resume --out-dir {shell_path(request.out_dir)}`"
            raise SaveFailed(e.what, todo) from None
    if summary is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    if json_out:
        print_json(summary.to_dict())
    else:
        print_train_summary(summary)


# ---------------------------------------------------------------------------- eval


@app.command("eval")
def eval_(
    checkpoint: Annotated[Optional[str], typer.Argument(help=CHECKPOINT_HELP, show_default=False)] = None,
    data: Annotated[
        Optional[str], typer.Option(help="Text file or folder to score. Default: the corpus the model was trained on.")
    ] = None,
    split: Annotated[
        Optional[Split],
        typer.Option(
            help="val: the validation split, as in training; test: the test split (data.test_path, or "
            "data.test_size/test_fraction of data.path); train; all: the whole file. Default: val of the run's own "
            "corpus, all of any other --data file.",
            show_default=False,
        ),
    ] = None,
    stride: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            help="Windows this many tokens apart, each scoring only what the one before did not, so every scored "
            "token after the first window sees at least block_size - stride earlier ones (1: the papers' "
            "fixed context). Default: block_size (non-overlapping windows).",
            show_default=False,
        ),
    ] = None,
    unknown: Annotated[
        Optional[Unknown],
        typer.Option(
            help="Characters outside the model's vocabulary. Default: replace where the model learned an unknown "
            "symbol (an encoder-decoder trained with data.unknown_dropout), else error.",
            show_default=False,
        ),
    ] = None,
    replace_with: Annotated[Optional[str], typer.Option(help=REPLACE_HELP)] = None,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.float32,
    batch_size: Annotated[int, typer.Option(min=1, help="Windows per forward pass.")] = 64,
    beam: Annotated[int, typer.Option(min=1, max=64, help="Encoder-decoder: decode with a beam of N.")] = 1,
    ensemble: EnsembleOption = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: loss, bpc, chars, split, file and runtime (torch, or onnxruntime for an ONNX "
            "export); a text's adds perplexity, stride and unit; pairs' exact_match, word_error_rate, "
            "char_error_rate, token_error_rate, lines and beam; a lines model's perplexity, unit, items and "
            "mean_logprob; an encoder's accuracy.",
        ),
    ] = False,
) -> None:
    """Score a checkpoint in one deterministic pass: nats and bits per character (per byte), perplexity.

    An encoder-decoder is scored on its pairs: target loss, exact match (word accuracy), character error rate and,
    for space-separated targets, token error rate (phoneme error rate for G2P), decoding greedily or with --beam. A
    lines model (data.format lines) is scored item by item: nats per character with each item's end symbol counted as
    one, and the mean log-likelihood of an item (items and mean_logprob in --json); `charlm score` gives each line's.
    """
    needs_torch()
    from charlm.api.entry import load
    from charlm.cli.report import print_score

    check_replacement(replace_with)
    model = load(checkpoint_path(checkpoint), device, precision.value)  # a bad checkpoint before a bad text
    members = load_ensemble(model, ensemble, device, precision.value)
    options: dict[str, Any] = {"beam": beam, "stride": stride, "batch_size": batch_size}
    options |= {"unknown": unknown.value} if unknown else {}  # else each family's own default
    options |= {"ensemble": members} if members else {}
    result = model.score(data, split.value if split else None, **options, replace_with=replace_with)
    if json_out:
        together = {"ensemble": [str(m.path) for m in [model, *members]]} if members else {}
        print_json(result.to_dict() | {"runtime": model.runtime} | together)
    else:
        print_score(result)


# ---------------------------------------------------------------------------- info, attention, export, plot, config

app.command("sample")(cli_sample.sample_)
app.command()(cli_sample.fill)
app.command()(cli_items.score)
# Commands that look at a model or at settings live in cli_inspect.py; registered here, after the main four, so that
# `charlm --help` lists them in this order.
app.command()(cli_inspect.info)
app.command()(cli_inspect.attention)
app.command("export")(cli_inspect.export_)
app.command()(cli_inspect.plot)
app.command("config")(cli_inspect.config_)
app.command()(cli_serve.serve)
app.command()(cli_sweep.sweep)


# ---------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> None:
    """The console script `charlm` (and `python -m charlm`); `argv` given: the command line run inside a program
    (the tests), which keeps its own garbage collector's settings."""
    if argv is None:
        quicker_collector()
    run_app(app, argv)
