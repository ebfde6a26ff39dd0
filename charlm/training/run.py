"""A training run: its configuration (fresh or resumed, decided here alone), its folder checked, its parts built.

`run_training` is what `charlm train` does and what Python callers use. It installs no signal handler: the command
line passes its own StopRequest (charlm.cli.signals), and a Python caller's Ctrl-C saves last.pt and propagates. The
folder's files are charlm.storage.run_folder's; the loop, the final pass and the summary are the Trainer's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from charlm.config import schema as cfg
from charlm.config.build import explicit_settings, load_config, raise_all
from charlm.config.checks import config_problems
from charlm.config.schema import Config
from charlm.data.download import ensure_builtin_corpus
from charlm.errors import UsageError
from charlm.hardware.device import configure_backends, pick_device, seed_everything
from charlm.hardware.distributed import Dist, setup, teardown
from charlm.progress import TrainReporter
from charlm.storage.checkpoint import RUNS_DIR, Checkpoint, load_checkpoint
from charlm.storage.run_folder import RunFolder, check_out_dir, make_out_dir
from charlm.storage.run_state import TrainSummary
from charlm.training.budget import BudgetRequest, default_budget, plan_budget
from charlm.training.finetune import SOURCE_KEYS, finetune_config, load_source
from charlm.training.loop import Trainer
from charlm.training.metrics import require_loggers
from charlm.training.probe import given_speed
from charlm.training.run_parts import describe_setup, run_corpus, run_model, start_from_checkpoint
from charlm.training.setup import StopRequest, seed_for_rank, training_dtype

# Keys that may change when resuming: limits, schedule knobs, logging and the sampling defaults. Anything else would
# silently make the resumed run a different run.
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
    "train.cpu_linear",
    "train.lr_schedule",
    "train.warmdown",
    "data.path",
    "train.loggers",
    "train.log_interval",
    "train.wandb_project",
    "train.tensorboard",
    "train.final_eval_tokens",
} | {f"sample.{f.name}" for f in fields(cfg.SampleConfig)}  # the checkpoint's sampling defaults: no part of training


# ---------------------------------------------------------------------------- the configuration


@dataclass
class RunRequest:
    """What a `charlm train` command (or `charlm.train` call) asks for, resolved: the run folder, the configuration
    of a fresh run, for a resume the settings to compare with the run's, and how the run starts."""

    out_dir: Path
    config: Config | None
    changes: dict[str, Any]
    resume: bool = False
    overwrite: bool = False
    init_from: str | Path | None = None
    extend_vocab: bool = False
    budget: BudgetRequest | None = None  # --budget: the recipe is chosen once the corpus is there (training.budget)

    def run(
        self, *, quiet: bool = False, reporter: TrainReporter | None = None, stop: StopRequest | None = None
    ) -> TrainSummary | None:
        config, notes, started = self.config, {}, time.perf_counter()  # the probe's seconds count in the run's wall
        if self.budget is not None:
            reporter = reporter or TrainReporter(quiet)
            check_out_dir(self.out_dir, self.resume, self.overwrite)  # a refused folder before the budget's line
            config = self.budget.config(reporter.info)
            notes = {"budget.json": self.budget.record()}
        return run_training(
            config,
            self.out_dir,
            resume=self.resume,
            overwrite=self.overwrite,
            resume_changes=self.changes,
            quiet=quiet,
            reporter=reporter,
            stop=stop,
            init_from=self.init_from,
            extend_vocab=self.extend_vocab,
            notes=notes,
            started=started,
        )


def resolve_run(
    config_file: str | None,
    sets: list[str],
    options: cfg.Options,
    out_dir: str | Path | None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    init_from: str | Path | None = None,
    extend_vocab: bool = False,
    budget: str | None = None,
    speed: str | None = None,
) -> RunRequest:
    """The one sequence the command line and the Python API share: the requested settings, then the run folder
    (given, or runs/<config name>). A `budget` ('10m') is checked here and picks its recipe when the run starts, for
    the `speed` given ('31k' characters a second of the reference model; CHARLM_SPEED) or measured then; a fresh run
    with no config file and no limit of its own is the rule's at DEFAULT_BUDGET."""
    planned = None
    fresh = not resume and init_from is None
    if budget is None:
        budget = default_budget(config_file, sets, options, fresh, lambda: given_speed(speed))
    if speed is not None and budget is None:
        raise UsageError(
            "--speed is the machine's speed for the budget rule, which picks a new run's recipe with --budget or "
            + (
                "with no --config and no limit; give --budget too (or leave --speed out)"
                if fresh
                else "with no --config; a resumed or fine-tuned run keeps its model: leave --speed out"
            )
        )
    if budget is not None:
        if resume:
            raise UsageError(
                "--budget picks a new run's recipe; a resumed run keeps its own (lengthen it with --max-seconds)"
            )
        if init_from is not None:
            raise UsageError(
                "--budget picks a model's shape and --init-from keeps its model's; give --max-seconds instead"
            )
        planned = plan_budget(budget, config_file, sets, options, given_speed(speed))
    # With a budget, the run's config waits for the rule (planned.config): plan_budget has checked the settings.
    settings, changes = (None, {}) if planned else requested_config(config_file, sets, options, resume, init_from)
    if init_from is not None and not resume:  # the source's model, unless the command line asks otherwise
        changes = {k: v for k, v in explicit_settings(sets, options).items() if k in SOURCE_KEYS}
    folder = Path(out_dir) if out_dir is not None else RUNS_DIR / Path(config_file or cfg.DEFAULT_CONFIG).stem
    return RunRequest(folder, settings, changes, resume, overwrite, init_from, extend_vocab, planned)


def requested_config(
    config_file: str | None, sets: list[str], options: cfg.Options, resume: bool, init_from: str | Path | None = None
) -> tuple[Config | None, dict[str, Any]]:
    """What a command asks for: a whole config for a fresh run; for a resume, the settings to compare with the run's
    (all of a --config file's keys with the command line's on top, or only the command line's without --config).

    A config file's data.path is not compared on resume unless --data (or --set data.path) gives it: the run's
    corpus fixed its vocabulary, and a file's default path says nothing about it.
    """
    if not resume and init_from is not None:  # the source's model and tokenizer: the command's own meet it later
        own = SOURCE_KEYS - {"model.arch"}  # the arch stays: it and data.format must agree in the run's config
        other_sets = [item for item in sets if cfg.parse_set(item).key not in own]
        other_options = {k: v for k, v in options.items() if k not in own}
        return load_config(config_file or cfg.DEFAULT_CONFIG, other_sets, other_options), {}
    if not resume:
        return load_config(config_file or cfg.DEFAULT_CONFIG, sets, options), {}
    explicit = explicit_settings(sets, options)
    if config_file is None:
        return None, explicit
    given = load_config(config_file, sets, options).flat()
    if "data.path" not in explicit:
        given.pop("data.path")
    return None, given


def resume_config(saved: Config, given: dict[str, Any]) -> Config:
    """The checkpoint's config with the command's settings applied.

    A setting equal to the saved value is fine (the same command, re-run with --resume); a real change is allowed for
    the keys in RESUMABLE_KEYS (limits, schedule knobs, sampling defaults) and refused for anything else, each
    problem named once.
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
    raise_all(errors)
    for key, value in changes.items():
        section, name = key.split(".", 1)
        setattr(getattr(saved, section), name, value)
    raise_all(config_problems(saved))  # the changes beside the run's other keys (both limits 0, say)
    return saved


def run_config(config: Config | None, ckpt: Checkpoint | None, changes: dict[str, Any]) -> Config:
    """The one place that decides a run's configuration: the given one for a fresh run; for a resume, the saved one
    with the given config's values and the explicit changes compared and applied."""
    if ckpt is None:
        if config is None:
            raise UsageError("a fresh run needs a configuration (pass --config, or leave out --resume)")
        return config
    return resume_config(ckpt.config, {**(config.flat() if config else {}), **changes})


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
    notes: dict[str, Any] | None = None,
    started: float | None = None,
) -> TrainSummary | None:
    """Everything `charlm train` does: checks first, then data, model, loop, final full validation pass.

    With resume=True the run in out_dir continues; `config` (if given) and `resume_changes` are compared with its
    saved settings (see resume_config). With init_from, a fresh run starts from that model's weights, shape and
    vocabulary (training.finetune; extend_vocab adds the new text's characters). Under torchrun every rank calls this;
    rank 0 alone writes files and returns the summary (the others return None). `notes` are JSON files for the run
    folder (budget.json); `started`, when the command began, if before this call (a budget's probe).
    """
    wall_start = time.perf_counter() if started is None else started
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
        if ckpt is not None and 0 < config.train.max_steps <= ckpt.step:  # nothing to train, nothing to record
            raise UsageError(
                f"{out_dir} is at step {ckpt.step:,}, already its limit of {config.train.max_steps:,} steps: give a "
                "larger --max-steps to train it further"
            )
        if source is not None:
            config = finetune_config(config, source, resume_changes or {})
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
            wall_start,
            notes,
        )
        summary = trainer.run()
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
    started: float | None = None,
    notes: dict[str, Any] | None = None,
) -> Trainer:
    """Data, model and trainer, every check done before the run folder is touched."""
    device = pick_device(device_name)
    training_dtype(config, device)  # refuses an impossible dtype before anything is loaded
    require_loggers(config)
    corpus = run_corpus(config, ckpt, source, extend_vocab, reporter)
    dist.barrier()  # every rank has checked the run folder before rank 0 writes to it
    if dist.is_main:
        make_out_dir(out_dir)

    configure_backends(device)
    seed_everything(config.train.seed)  # identical initial weights on every rank
    model = run_model(config, ckpt, source, corpus.tokenizer.vocab_size, device, reporter)
    seed_everything(seed_for_rank(config.train.seed, dist.rank))  # then each rank its own dropout stream
    folder = RunFolder(out_dir, config, corpus.tokenizer, writes=dist.is_main, replaced=replaced, notes=notes)
    trainer = Trainer(config, model, corpus, device, folder, reporter, stop, dist, started)
    start_from_checkpoint(trainer, ckpt, config, out_dir, reporter)
    describe_setup(trainer, config, device, dist, reporter)
    return trainer
