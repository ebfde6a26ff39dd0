"""The `charlm` command line: parsing, messages and exit codes only; the work lives in the other modules."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from charlm import __version__
from charlm.errors import USAGE_EXIT, CharlmError, Interrupted, UsageError

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


class State:
    debug = False


def _version(value: bool) -> None:
    if value:
        typer.echo(f"charlm {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the Python traceback when something fails.")] = False,
) -> None:
    State.debug = debug
    from charlm.device import require_torch  # imports torch: after --help and --version, which need none

    require_torch()


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------- download


@app.command()
def download(
    url: Annotated[Optional[str], typer.Option(help="http://, https:// or file:// URL. Default: $CHARLM_DATA_URL, else tiny-shakespeare's canonical URL.")] = None,
    dest: Annotated[Path, typer.Option(help="Where to write the file.")] = Path("data/tinyshakespeare.txt"),
    sha256: Annotated[Optional[str], typer.Option(help="Expected SHA-256 (hex) of another corpus. Default: tiny-shakespeare's.")] = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the SHA-256 check (for other corpora).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Download again even if the file is already there.")] = False,
    retries: Annotated[int, typer.Option(min=0, max=10, help="Extra attempts after a transient failure (backoff 1, 2, 4, 8 s).")] = 4,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the server on each attempt.")] = 10.0,
) -> None:
    """Fetch tiny-shakespeare (or another text) and verify its SHA-256; keeps a verified file that is already there."""
    from charlm import download as dl
    from charlm.progress import DownloadBar, stderr_console

    source = dl.resolve_url(url)
    expected = None if no_verify else (sha256 or dl.TINY_SHAKESPEARE_SHA256)
    with DownloadBar(dest.name) as bar:
        result = dl.download(source, dest, expected, force=force, retries=retries, timeout=timeout, progress=bar.update)
    what = "downloaded" if result.downloaded else "already there, verified" if expected else "already there (not verified)"
    stderr_console().print(f"{result.path}: {what} ({result.bytes:,} bytes, sha256 {result.sha256[:16]}...)")


# ---------------------------------------------------------------------------- train


@app.command()
def train(
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML config file, or a shipped config's name (tiny, cpu, notebook, gpu). Default: cpu.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override one key: section.key=value (repeatable), e.g. --set train.lr=3e-4.")] = None,
    data: Annotated[Optional[str], typer.Option(help="UTF-8 text file to train on (data.path).")] = None,
    out_dir: Annotated[Optional[Path], typer.Option(help="Run folder. Default: runs/<config name>.")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu, cuda, cuda:N or mps (train.device).")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Optimizer steps at most (train.max_steps).")] = None,
    max_seconds: Annotated[Optional[float], typer.Option(help="Training time budget in seconds (train.max_seconds).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed (train.seed).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out-dir from its last.pt.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the run already in --out-dir.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or evaluation lines.")] = False,
) -> None:
    """Train a model; with no options, trains configs/cpu.yaml on tiny-shakespeare (downloaded when missing)."""
    from charlm import config as cfg
    from charlm.download import DEFAULT_DEST, ensure_corpus
    from charlm.progress import TrainReporter
    from charlm.report import print_train_summary
    from charlm.train import run_training

    if resume and overwrite:
        raise UsageError("--resume and --overwrite contradict each other; choose one")
    options = {
        "data.path": ("--data", data), "train.device": ("--device", device), "train.max_steps": ("--max-steps", max_steps),
        "train.max_seconds": ("--max-seconds", max_seconds), "train.seed": ("--seed", seed),
    }
    config_name = config or cfg.DEFAULT_CONFIG
    run_dir = out_dir or Path("runs") / Path(config_name).stem
    reporter = TrainReporter(quiet)
    if resume:
        changes = cfg.explicit_settings(set_ or [], options)
        settings = None
    else:
        changes = {}
        settings = cfg.load_config(config_name, set_ or [], options)
        if Path(settings.data.path) == DEFAULT_DEST:
            ensure_corpus(DEFAULT_DEST, reporter.info)
    summary = run_training(settings, run_dir, resume=resume, overwrite=overwrite, resume_changes=changes, reporter=reporter)
    if summary is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    if json_out:
        _print_json(summary.to_dict())
    else:
        print_train_summary(summary)


# ---------------------------------------------------------------------------- eval


@app.command("eval")
def eval_(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint file, e.g. runs/cpu/best.pt.")],
    data: Annotated[Optional[str], typer.Option(help="UTF-8 text to score. Default: the file the model was trained on.")] = None,
    split: Annotated[str, typer.Option(help="val (the held-out tail, as in training), train, or all of the text.")] = "val",
    unknown: Annotated[str, typer.Option(help="Characters outside the model's vocabulary: error, skip or replace.")] = "error",
    replace_with: Annotated[Optional[str], typer.Option(help="Character used by --unknown replace. Default: space.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")] = "auto",
    batch_size: Annotated[int, typer.Option(min=1, help="Windows per forward pass.")] = 64,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object: loss, bpc, perplexity, chars.")] = False,
) -> None:
    """Score a checkpoint on text in one deterministic full pass: nats/char, bits/char, perplexity."""
    from charlm.evaluate import evaluate_checkpoint
    from charlm.report import print_eval_result

    _choice("--split", split, ("train", "val", "all"))
    _choice("--unknown", unknown, ("error", "skip", "replace"))
    if replace_with is not None and len(replace_with) != 1:
        raise UsageError(f"--replace-with takes one character, got {replace_with!r}")
    result = evaluate_checkpoint(checkpoint, data, split, unknown, device, batch_size, replace_with)
    if json_out:
        _print_json(result.to_dict())
    else:
        print_eval_result(result, split)


# ---------------------------------------------------------------------------- sample


@app.command("sample")
def sample_(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint file, e.g. runs/cpu/best.pt.")],
    prompt: Annotated[Optional[str], typer.Option(help="Text to continue. Default: a newline.")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option(help="Read the prompt from this UTF-8 file instead.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(min=0, help="Characters to generate per sample. Default: the checkpoint's sample.max_new_tokens.")] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0.0, help="Softmax temperature; 0 = greedy (argmax).")] = None,
    top_k: Annotated[Optional[int], typer.Option(min=1, help="Keep only the K most likely characters (clamped to the vocabulary).")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus: keep the smallest set of characters reaching probability P (0 < P <= 1).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Same seed and options give the same text on the same device.")] = None,
    num_samples: Annotated[int, typer.Option(min=1, max=1024, help="Samples generated together as one batch.")] = 1,
    stop: Annotated[Optional[list[str]], typer.Option(help="End a sample at the first occurrence of this string (included). Repeatable.")] = None,
    unknown: Annotated[str, typer.Option(help="Prompt characters outside the vocabulary: error, skip or replace.")] = "error",
    replace_with: Annotated[Optional[str], typer.Option(help="Character used by --unknown replace. Default: space.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")] = "auto",
    stream: Annotated[Optional[bool], typer.Option("--stream/--no-stream", help="Print characters as they come (default: on a terminal, with one sample).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Recompute the whole window every step (slow; the reference path).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help='Print one JSON object: {"samples": [...], "chars_per_s": ...}.')] = False,
) -> None:
    """Generate text from a checkpoint, continuing a prompt (KV-cached; temperature, top-k, top-p, stop strings)."""
    from charlm.checkpoint import load_checkpoint
    from charlm.data import read_text
    from charlm.device import pick_device
    from charlm.generate import SampleOptions, encode_prompt, sample

    _choice("--unknown", unknown, ("error", "skip", "replace"))
    if prompt is not None and prompt_file is not None:
        raise UsageError("give --prompt or --prompt-file, not both")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise UsageError(f"--top-p must be in (0, 1], got {top_p} (1 keeps every character)")
    if any(s == "" for s in stop or []):
        raise UsageError("--stop needs a non-empty string")
    text = read_text(prompt_file) if prompt_file is not None else ("\n" if prompt is None else prompt)
    ckpt = load_checkpoint(checkpoint)
    defaults = ckpt.config.sample
    model = ckpt.build_model(pick_device(device))  # a bad checkpoint is reported before a bad prompt
    prompt_ids = encode_prompt(ckpt.tokenizer, text, unknown, replace_with)
    options = SampleOptions(
        max_new_tokens=defaults.max_new_tokens if max_new_tokens is None else max_new_tokens,
        temperature=defaults.temperature if temperature is None else temperature,
        top_k=defaults.top_k if top_k is None else top_k,
        top_p=defaults.top_p if top_p is None else top_p,
        seed=seed, num_samples=num_samples, stop=stop or [], use_cache=not no_cache,
    )
    streaming = not json_out and num_samples == 1 and (stream if stream is not None else sys.stdout.isatty())
    if streaming:
        sys.stdout.write(ckpt.tokenizer.decode(prompt_ids))
        sys.stdout.flush()
    result = sample(model, ckpt.tokenizer, prompt_ids, options, on_text=_write_flushed if streaming else None)
    if json_out:
        _print_json({"samples": result.samples, "chars_per_s": result.chars_per_s})
    elif streaming:
        sys.stdout.write("\n")
    else:
        for i, text in enumerate(result.samples):
            if num_samples > 1:
                sys.stdout.write(f"--- sample {i + 1} ---\n")
            sys.stdout.write(text + "\n")


def _write_flushed(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ---------------------------------------------------------------------------- info


@app.command()
def info(
    checkpoint: Annotated[Optional[str], typer.Argument(help="Checkpoint file; or use --config.")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML config or shipped config name (no data needed). Default: cpu.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override one key: section.key=value (repeatable).")] = None,
    vocab_size: Annotated[int, typer.Option(min=1, help="Vocabulary size with --config (tiny-shakespeare has 65).")] = 65,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (total_params, flops_per_token, components).")] = False,
) -> None:
    """Parameters per component and training FLOPs per token, each beside its formula."""
    from charlm import config as cfg
    from charlm.checkpoint import load_checkpoint
    from charlm.info import model_info
    from charlm.report import print_model_info

    if checkpoint is not None and (config is not None or set_):
        raise UsageError("give a checkpoint or --config/--set, not both")
    if checkpoint is not None:
        ckpt = load_checkpoint(checkpoint)
        ckpt.build_model()  # the same checks as eval and sample: shapes, vocabulary, finite weights
        model_config, vocab, title = ckpt.config.model, ckpt.tokenizer.vocab_size, checkpoint
    else:
        model_config = cfg.load_config(config or cfg.DEFAULT_CONFIG, set_ or []).model
        vocab, title = vocab_size, f"{config or cfg.DEFAULT_CONFIG} (vocabulary {vocab_size})"
    result = model_info(model_config, vocab)
    if json_out:
        _print_json(result.to_dict())
    else:
        print_model_info(result, title)


# ---------------------------------------------------------------------------- plot and config


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run folders (each with metrics.jsonl).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG file to write.")] = Path("loss.png"),
) -> None:
    """Plot train and val loss against step and wall time, with the learning rate (needs charlm[plot])."""
    from charlm.plot import plot_runs
    from charlm.progress import stderr_console

    written = plot_runs(run_dirs, output)
    stderr_console().print(f"wrote {written}")


@app.command("config")
def config_(
    show: Annotated[bool, typer.Option("--show", help="Print the resolved configuration as YAML.")] = False,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML config or shipped config name. Default: cpu.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override one key: section.key=value (repeatable).")] = None,
) -> None:
    """Show the configuration a `charlm train` with the same --config/--set would use (every key, resolved)."""
    from charlm import config as cfg

    if not show:
        raise UsageError("charlm config needs --show (it prints the resolved configuration as YAML)")
    sys.stdout.write(cfg.load_config(config or cfg.DEFAULT_CONFIG, set_ or []).to_yaml())


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


# ---------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: one clear line on stderr and an exit code for every failure; a traceback only with --debug."""
    from charlm.progress import stderr_console

    console = stderr_console()
    signal.signal(signal.SIGTERM, _terminated)  # training installs its own handler; this covers start-up
    try:
        code = app(args=argv, prog_name="charlm", standalone_mode=False)
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
            where = e.ctx.command_path if getattr(e, "ctx", None) else "charlm"
            console.print(f"[red]error:[/red] {escape(e.format_message())} (see '{where} --help')")
            code = USAGE_EXIT
        elif State.debug:
            raise
        else:
            console.print(f"[red]internal error:[/red] {escape(f'{type(e).__name__}: {e}')} (rerun with --debug for the traceback)")
            code = 1
    sys.exit(code or 0)


def _terminated(signum: int, frame: object) -> None:
    raise Interrupted("SIGTERM received before any work was done; nothing was written", signum)


def _is_click_usage_error(e: Exception) -> bool:
    # typer >= 0.26 vendors click, so match the class by name rather than import one of two copies
    return any(cls.__name__ == "UsageError" for cls in type(e).__mro__) and hasattr(e, "format_message")
