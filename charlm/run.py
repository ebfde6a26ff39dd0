"""A training run: its folder, its configuration (fresh or resumed, decided here alone), its parts, its summary.

`run_training` is what `charlm train` does and what Python callers use. It installs no signal handler: the command
line passes its own StopRequest (charlm.signals), and a Python caller's Ctrl-C saves last.pt and propagates.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from charlm import config as cfg
from charlm.arch import build_model
from charlm.checkpoint import RUNS_DIR, Checkpoint, load_checkpoint
from charlm.config import Config
from charlm.data import Corpus
from charlm.device import autocast_dtype, configure_backends, pick_device, seed_everything
from charlm.distributed import Dist, setup, teardown
from charlm.download import ensure_builtin_corpus
from charlm.errors import UsageError
from charlm.evaluate import EvalResult, full_pass
from charlm.files import atomic_write, remove_stale_temps
from charlm.finetune import finetune_config, finetune_tokenizer, init_model, load_source
from charlm.masked import EncoderOnly, all_windows, masked_score
from charlm.metrics import require_loggers
from charlm.pairs import PairCorpus, pairs_total
from charlm.progress import TrainReporter
from charlm.trainer import StopRequest, Trainer, seed_for_rank

RUN_FILES = ("last.pt", "best.pt", "metrics.jsonl", "config.yaml", "steps.jsonl", "summary.json", "metrics.csv")
# Keys that may change when resuming: limits and schedule knobs. Anything else would silently
# make the resumed run a different run.
RESUMABLE_KEYS = {
    "train.max_steps",
    "train.max_seconds",
    "train.eval_interval",
    "train.early_stop_patience",
    "train.plateau_patience",
    "train.plateau_factor",
    "train.min_lr",
    "train.grad_clip",
    "train.device",
    "train.compile",
    "train.lr_schedule",
    "data.path",
    "train.loggers",
    "train.log_interval",
    "train.wandb_project",
    "train.tensorboard",
    "train.final_eval_tokens",
}


@dataclass
class TrainSummary:
    best_val_loss: float  # best periodic validation estimate (nats/char)
    full_val_loss: float  # validation pass of best.pt (nats/token), all of val up to train.final_eval_tokens
    full_val_bpc: float
    full_val_tokens: int  # tokens that pass scored
    full_val_whole: bool  # whether that was the whole validation split
    unit: str  # char or byte: what the losses are per
    steps: int
    tokens: int  # training tokens seen, over all invocations
    wall_s: float  # this invocation, start-up to finish
    train_s: float  # time in training steps (evaluation and compilation excluded)
    eval_s: float
    compile_s: float
    tokens_per_s: float  # this invocation's training tokens / train_s
    stop_reason: str
    params: int
    device: str
    out_dir: str
    peak_memory_mb: float  # RSS of this process on CPU; max allocated tensor memory on CUDA
    world_size: int  # processes (torchrun ranks)
    global_batch: int  # windows per optimizer step: batch_size x grad_accum x world_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- the configuration


@dataclass
class RunRequest:
    """What a `charlm train` command (or `charlm.train` call) asks for, resolved: the run folder, the configuration
    of a fresh run, and for a resume the settings to compare with the run's."""

    out_dir: Path
    config: Config | None
    changes: dict[str, Any]


def resolve_run(
    config_file: str | None, sets: list[str], options: cfg.Options, resume: bool, out_dir: str | Path | None
) -> RunRequest:
    """The one sequence the command line and the Python API share: the requested settings, then the run folder
    (given, or runs/<config name>)."""
    settings, changes = requested_config(config_file, sets, options, resume)
    folder = Path(out_dir) if out_dir is not None else RUNS_DIR / Path(config_file or cfg.DEFAULT_CONFIG).stem
    return RunRequest(folder, settings, changes)


def requested_config(
    config_file: str | None, sets: list[str], options: cfg.Options, resume: bool
) -> tuple[Config | None, dict[str, Any]]:
    """What a command asks for: a whole config for a fresh run; for a resume, the settings to compare with the run's
    (all of a --config file's keys with the command line's on top, or only the command line's without --config).

    A config file's data.path is not compared on resume unless --data (or --set data.path) gives it: the run's
    corpus fixed its vocabulary, and a file's default path says nothing about it.
    """
    if not resume:
        return cfg.load_config(config_file or cfg.DEFAULT_CONFIG, sets, options), {}
    explicit = cfg.explicit_settings(sets, options)
    if config_file is None:
        return None, explicit
    given = cfg.load_config(config_file, sets, options).flat()
    if "data.path" not in explicit:
        given.pop("data.path")
    return None, given


def resume_config(saved: Config, given: dict[str, Any]) -> Config:
    """The checkpoint's config with the command's settings applied.

    A setting equal to the saved value is fine (the same command, re-run with --resume); a real change is allowed for
    the limits and schedule knobs in RESUMABLE_KEYS and refused for anything else, each problem named once.
    """
    saved_values = saved.flat()
    errors, changes = [], {}
    for key, value in given.items():
        if value == saved_values[key]:
            continue
        if key in RESUMABLE_KEYS:
            changes[key] = value
            continue
        why = (
            "the model's shape is fixed"
            if key.startswith("model.")
            else f"only these can: {', '.join(sorted(RESUMABLE_KEYS))}"
        )
        errors.append(
            f"{key} cannot change when resuming (the run has {saved_values[key]!r}, this command gives "
            f"{value!r}); {why}. Start a new run with another --out-dir, or drop the setting"
        )
    cfg.raise_all(errors)
    for key, value in changes.items():
        section, name = key.split(".", 1)
        setattr(getattr(saved, section), name, value)
    return saved


def run_config(config: Config | None, ckpt: Checkpoint | None, changes: dict[str, Any]) -> Config:
    """The one place that decides a run's configuration: the given one for a fresh run; for a resume, the saved one
    with the given config's values and the explicit changes compared and applied."""
    if ckpt is None:
        if config is None:
            raise UsageError("a fresh run needs a configuration (pass --config, or leave out --resume)")
        return config
    return resume_config(ckpt.config, {**(config.flat() if config else {}), **changes})


# ---------------------------------------------------------------------------- the run folder


def check_out_dir(out_dir: Path, resume: bool, overwrite: bool) -> list[str]:
    """Refuse to clobber a run by accident (nothing is written here). Returns the run files already there."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir} is a file, not a folder; choose another --out-dir")
    existing = [name for name in RUN_FILES if (out_dir / name).exists()]
    if resume:
        if not (out_dir / "last.pt").exists():
            raise UsageError(f"nothing to resume: {out_dir / 'last.pt'} does not exist (train without --resume first)")
    elif existing and not overwrite:
        raise UsageError(
            f"{out_dir} already holds a run ({', '.join(existing)}); use --resume to continue it, "
            "--overwrite to start over, or another --out-dir"
        )
    return existing


def make_out_dir(out_dir: Path, replaced: list[str]) -> None:
    """Create the run folder and prove it writable; remove the files of a run being overwritten; drop stale temps."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / ".write-test", lambda f: f.write(b"ok"))
        (out_dir / ".write-test").unlink()
    except OSError as e:
        raise UsageError(f"cannot write to --out-dir {out_dir}: {e.strerror}; choose a writable folder") from None
    for name in replaced:
        (out_dir / name).unlink()
    for name in RUN_FILES:  # any file the run writes atomically may have a temp left by a kill mid-write
        remove_stale_temps(out_dir / name)


# ---------------------------------------------------------------------------- the run


def run_training(
    config: Config | None,
    out_dir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    resume_changes: dict[str, Any] | None = None,
    quiet: bool = False,
    reporter: TrainReporter | None = None,
    stop: StopRequest | None = None,
    init_from: str | Path | None = None,
    extend_vocab: bool = False,
) -> TrainSummary | None:
    """Everything `charlm train` does: checks first, then data, model, loop, final full validation pass.

    With resume=True the run in out_dir continues; `config` (if given) and `resume_changes` are compared with its
    saved settings (see resume_config). With init_from, a fresh run starts from that model's weights, shape and
    vocabulary (charlm.finetune; extend_vocab adds the new text's characters). Under torchrun every rank calls this;
    rank 0 alone writes files and returns the summary (the others return None).
    """
    wall_start = time.perf_counter()
    created = not out_dir.exists()
    dist = Dist()
    reporter = reporter or TrainReporter(quiet)
    try:
        if resume and init_from is not None:
            raise UsageError("--resume continues a run and --init-from starts a new one from a model; choose one")
        existing = check_out_dir(out_dir, resume, overwrite)
        ckpt = load_checkpoint(out_dir / "last.pt") if resume else None
        source = load_source(init_from) if init_from is not None else None
        config = run_config(config, ckpt, resume_changes or {})
        if source is not None:
            config = finetune_config(config, source)
        if ckpt is None:
            ensure_builtin_corpus(config.data.path, reporter.info)
        dist, device_name = setup(config.train.device)
        if not dist.is_main:
            reporter = TrainReporter(quiet=True, silent=True)
        trainer = _build(
            config,
            ckpt,
            out_dir,
            existing if overwrite and not resume else [],
            device_name,
            dist,
            reporter,
            stop,
            source,
            extend_vocab,
        )
        try:
            reason = trainer.run()
            summary = _summarize(trainer, reason, wall_start) if dist.is_main else None
            if summary is not None:
                trainer.metrics.finish(summary.to_dict())
        finally:
            trainer.metrics.close()  # at the end, and on interruption or failure
        dist.barrier()  # leave together: a rank tearing down while rank 0 still evaluates can abort (gloo)
        return summary
    except BaseException:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # stopped before anything was written: leave no trace
        raise
    finally:
        teardown(dist)


def _build(
    config: Config,
    ckpt: Checkpoint | None,
    out_dir: Path,
    replaced: list[str],
    device_name: str,
    dist: Dist,
    reporter: TrainReporter,
    stop: StopRequest | None,
    source: Checkpoint | None = None,
    extend_vocab: bool = False,
) -> Trainer:
    """Data, model and trainer, every check done before the run folder is touched."""
    device = pick_device(device_name)
    autocast_dtype(device, config.train.dtype)  # refuse an impossible dtype before loading anything
    require_loggers(config)
    # Every rank asks for the prepared corpus; a lock lets the first prepare it while the others wait, then map it.
    corpus: Corpus | PairCorpus
    if config.data.format == "pairs":
        if source is not None:
            raise UsageError("--init-from starts from a text model; an encoder-decoder run starts fresh or resumes")
        hint = "a resumed run trains on lines made of its own characters"
        tokenizer = ckpt.tokenizer if ckpt is not None else None
        corpus = PairCorpus.from_config(config.data, config.model.block_size, tokenizer, reporter.info, hint)
    elif ckpt is not None:
        corpus = Corpus.from_config(
            config.data,
            ckpt.tokenizer,
            say=reporter.info,
            hint="a resumed run trains on text made of its own characters",
        )
    elif source is not None:
        tokenizer = finetune_tokenizer(source, config.data.path, extend_vocab, reporter.info)
        corpus = Corpus.from_config(
            config.data,
            tokenizer,
            say=reporter.info,
            hint=f"the model of {source.path} has never seen them; add --extend-vocab to give them new embedding rows",
        )
    else:
        corpus = Corpus.from_config(config.data, say=reporter.info)
    corpus.check_windows(config.model.block_size, config.data.path)
    dist.barrier()  # every rank has checked the run folder before rank 0 writes to it
    if dist.is_main:
        make_out_dir(out_dir, replaced)

    configure_backends(device)
    seed_everything(config.train.seed)  # identical initial weights on every rank
    if ckpt is not None:
        model = ckpt.build_model(device)
    elif source is not None:
        model = init_model(source, config, corpus.tokenizer.vocab_size, device)
        reporter.info(f"starting from the weights of {source.path} (fresh optimizer and schedule)")
    else:
        model = build_model(config.model, corpus.tokenizer.vocab_size).to(device)
    seed_everything(seed_for_rank(config.train.seed, dist.rank))  # then each rank its own dropout stream
    trainer = Trainer(config, model, corpus, device, out_dir, reporter, stop, dist)
    if ckpt:
        trainer.load_training_state(ckpt.training_state(), ckpt.path)
        reporter.info(f"resuming {out_dir / 'last.pt'} at step {trainer.step}")
    reporter.info(trainer.schedule.describe())
    if dist.active:
        reporter.info(
            f"DDP: {dist.world_size} processes, global batch {trainer.global_batch} windows "
            f"({config.train.batch_size} per rank x {config.train.grad_accum} accumulation)"
        )
    return trainer


def _summarize(trainer: Trainer, reason: str, wall_start: float) -> TrainSummary:
    """The final full validation pass of best.pt, and the figures of the whole run."""
    config, device = trainer.config, trainer.device
    best = load_checkpoint(trainer.out_dir / "best.pt").build_model(device)
    limit = config.train.final_eval_tokens
    if isinstance(trainer.corpus, PairCorpus):  # every validation line's target characters
        total, count = pairs_total(best, trainer.corpus.val, device, amp_dtype=trainer.amp_dtype)
        full, whole = EvalResult(total / count, count, "val", config.data.path), True
    else:
        val = trainer.corpus.val[: limit + 1] if limit else trainer.corpus.val  # bounded on big corpora
        whole = len(val) == len(trainer.corpus.val)
        if isinstance(best, EncoderOnly):  # every whole window of the split, its characters hidden alike
            total, _, count = masked_score(best, val, all_windows(val, config.model.block_size), device)
            full = EvalResult(total / max(count, 1), count, "val", config.data.path)
        else:
            full = full_pass(best, val, config.model.block_size, device, amp_dtype=trainer.amp_dtype)
    return TrainSummary(
        best_val_loss=trainer.best_val,
        full_val_loss=full.loss,
        full_val_bpc=full.bpc,
        full_val_tokens=full.chars,
        full_val_whole=whole,
        unit=trainer.corpus.tokenizer.unit,
        steps=trainer.step,
        tokens=trainer.tokens,
        wall_s=time.perf_counter() - wall_start,
        train_s=trainer.train_s,
        eval_s=trainer.eval_s,
        compile_s=trainer.compile_s,
        tokens_per_s=trainer.tokens_per_s,
        stop_reason=reason,
        params=sum(p.numel() for p in trainer.model.parameters()),
        device=str(device),
        out_dir=str(trainer.out_dir),
        peak_memory_mb=peak_memory_mb(device),
        world_size=trainer.dist.world_size,
        global_batch=trainer.global_batch,
    )


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource  # POSIX only
    except ImportError:
        return 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux
