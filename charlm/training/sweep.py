"""`charlm sweep`: a spec's trials run one at a time, each a normal run folder, searched by Optuna (grid, random or
TPE) and pruned on their own periodic evaluations; the study lives in an SQLite file that a killed sweep goes on from.

The sweep folder's files are named in charlm.training.sweep_folder, its trials' run folders (trial-NNN) by
_next_folder; its lock is held with flock while a sweep runs (the kernel lets go when the process dies, so a killed
sweep never blocks the next).

A trial counts once it is complete, pruned, or failed for a reason of its own settings (a combination that is no
config, a diverged run). A trial cut short from outside (a kill, a signal, a full disk) does not count: its values
are queued again for the same folder, and the rerun replaces what it left. Under the lock any trial still marked
running was left by a dead process, so the next sweep fails it and queues it again the same way, once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from charlm.data.download import ensure_builtin_corpus
from charlm.data.prepare import source_files
from charlm.errors import CharlmError, Interrupted, SaveFailed, UsageError, WorkError, shell_path
from charlm.files import atomic_write, folder_problem
from charlm.progress import TrainReporter
from charlm.training.run import run_training
from charlm.training.setup import StopRequest
from charlm.training.sweep_folder import BEST_FILE, KIND, LOCK_FILE, RESULTS_FILE, STUDY_FILE, STUDY_NAME
from charlm.training.sweep_spec import Param, SweepSpec

# Pruning: the median rule, once 3 trials have completed, from the third tenth of a trial's budget on (earlier
# losses say little about where a run ends).
PRUNE_AFTER_TRIALS, PRUNE_FROM_TENTH = 3, 3


def require_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise UsageError(
            'charlm sweep searches with Optuna: pip install -e ".[sweep]" in your charlm checkout '
            "(or pip install optuna)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class SweepLock:
    """An exclusive flock on SWEEP_DIR/sweep.lock, holding the owner's pid for the refusal's message."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK_FILE
        self.file: Any = None

    def __enter__(self) -> SweepLock:
        import fcntl

        self.file = open(self.path, "a+")  # held open, and locked, for the sweep's lifetime
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.seek(0)
            owner = self.file.read().strip() or "?"
            self.file.close()
            raise UsageError(
                f"another charlm sweep (pid {owner}) is running in {self.path.parent}; wait for it to end, or give "
                "another --out-dir"
            ) from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(str(os.getpid()))
        self.file.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()  # closing lets go of the lock


class Pruned(Exception):
    """Raised from a trial's evaluation when the pruner gives up on it (caught by the sweep, never seen by users)."""


class TrialReporter(TrainReporter):
    """A trial's progress: the bar only (the header and evaluation lines would repeat for every trial), and each
    evaluation reported to Optuna at every tenth of the trial's budget it has passed, so that trials of different
    speeds are compared at the same share of their budget; the pruner may stop the trial there."""

    def __init__(self, trial: Any, max_steps: int, max_seconds: float, prune: bool, quiet: bool):
        super().__init__(quiet)
        self.trial, self.max_steps, self.max_seconds, self.prune = trial, max_steps, max_seconds, prune
        self.tenths = 0  # tenths of the budget reported so far
        self.last_val: float | None = None

    def info(self, message: str) -> None:
        pass

    def evaluation(
        self,
        step: int,
        train_loss: float,
        val_loss: float,
        lr: float,
        tokens_per_s: float,
        elapsed_s: float,
        improved: bool,
        accuracy: float | None = None,
    ) -> None:
        self.last_val = val_loss
        shares = [
            step / self.max_steps if self.max_steps else 0.0,
            elapsed_s / self.max_seconds if self.max_seconds else 0.0,
        ]
        reached = min(int(max(shares) * 10 + 1e-9), 10)
        if reached <= self.tenths:
            return
        for tenth in range(self.tenths + 1, reached + 1):  # a later loss stands for the tenths passed since the last
            self.trial.report(val_loss, tenth)
        self.tenths = reached
        if self.prune and self.trial.should_prune():
            raise Pruned(f"pruned at step {step} ({reached}/10 of its budget), val {val_loss:.4f}")


# ---------------------------------------------------------------------------- the sweep


def run_sweep(
    spec: SweepSpec,
    out_dir: Path,
    *,
    stop: StopRequest | None = None,
    say: Callable[[str], None] = lambda message: None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run the trials the study still lacks, one at a time; returns results.json's content."""
    optuna = require_optuna()
    _check_folder(out_dir)
    _check_data(spec, say)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write to --out-dir {out_dir}: {folder_problem(out_dir, e)}; choose another") from None
    with SweepLock(out_dir):
        study = _open_study(optuna, spec, out_dir)
        for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            say(f"trial {frozen.number} was cut short (its process was killed): its values are queued again")
            values = {**frozen.system_attrs.get("fixed_params", {}), **frozen.params}  # a grid's, even if undrawn
            _requeue(optuna, study, frozen.number, values, frozen.user_attrs)
        while (done := _counted(optuna, study)) < spec.trials:
            if stop is not None and stop.requested:
                raise Interrupted("stopped between two trials", stop.requested)
            _run_trial(optuna, study, spec, out_dir, done, stop, say, quiet)
            _write_results(optuna, study, spec, out_dir)
        results = _write_results(optuna, study, spec, out_dir)
        _write_best(spec, results, out_dir)
    return results


def _check_folder(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir} is a file, not a folder; choose another --out-dir")
    others = out_dir.is_dir() and any(p.name != LOCK_FILE for p in out_dir.iterdir())  # a sweep starting: its lock
    if others and not (out_dir / STUDY_FILE).exists():
        raise UsageError(
            f"{out_dir} holds other files and no {STUDY_FILE}: it is not a sweep; choose another --out-dir"
        )


def _check_data(spec: SweepSpec, say: Callable[[str], None]) -> None:
    """The corpus every trial shares, or each one a swept data.path chooses, fetched or refused before the first
    trial (a missing one would fail every trial that drew it, and the folder would then hold the spec's study)."""
    swept = next((p for p in spec.params if p.key == "data.path"), None)
    for path in swept.choices or () if swept else (spec.trial_config({}).data.path,):
        ensure_builtin_corpus(str(path), say)
        source_files(Path(path))


def _open_study(optuna: Any, spec: SweepSpec, out_dir: Path) -> Any:
    from sqlalchemy.exc import SQLAlchemyError  # optuna's storage layer

    storage = f"sqlite:///{(out_dir / STUDY_FILE).resolve()}"
    try:
        study = optuna.create_study(storage=storage, study_name=STUDY_NAME, direction="minimize", load_if_exists=True)
    except SQLAlchemyError as e:
        cause = str(getattr(e, "orig", None) or e).splitlines()[0]
        raise UsageError(
            f"{out_dir / STUDY_FILE} cannot be opened as an Optuna study ({cause}); if it is damaged, move it away "
            "to start the sweep afresh, or give another --out-dir"
        ) from e
    saved = study.user_attrs.get("spec")
    if saved is not None and saved != spec.identity():
        differs = next(k for k in spec.identity() if saved.get(k) != spec.identity()[k])
        raise UsageError(
            f"{out_dir} holds a sweep of another spec (its {differs} differs); run it with the spec it began with, "
            "or give another --out-dir"
        )
    seed = spec.seed + len(study.trials)  # a resumed sweep draws new values, not the first ones again
    if spec.sampler == "tpe":
        startup = max(3, min(10, spec.trials // 3))
        study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
    else:  # grid trials are all queued with their values; the sampler is never asked for them
        study.sampler = optuna.samplers.RandomSampler(seed=seed)
    study.pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=PRUNE_AFTER_TRIALS, n_warmup_steps=PRUNE_FROM_TENTH)
        if spec.prune
        else optuna.pruners.NopPruner()
    )
    if spec.sampler == "grid":
        queued = {t.user_attrs["grid"] for t in study.get_trials(deepcopy=False) if "grid" in t.user_attrs}
        for index, values in enumerate(spec.grid()[: spec.trials]):
            if index not in queued:
                study.enqueue_trial(values, user_attrs={"grid": index})
    if saved is None:
        study.set_user_attr("spec", spec.identity())
    return study


def _counted(optuna: Any, study: Any) -> int:
    return sum(_counts(optuna, t) for t in study.get_trials(deepcopy=False))


def _counts(optuna: Any, trial: Any) -> bool:
    state = optuna.trial.TrialState
    return trial.state in (state.COMPLETE, state.PRUNED) or (trial.state == state.FAIL and "error" in trial.user_attrs)


def _requeue(optuna: Any, study: Any, number: int, params: dict[str, Any], attrs: dict[str, Any]) -> None:
    """A trial cut short from outside: its values queued again (once) for the same folder, then it is failed."""
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    if not any(t.user_attrs.get("rerun_of") == number for t in waiting):
        kept = {k: v for k, v in attrs.items() if k in ("folder", "grid")}
        study.enqueue_trial(params, user_attrs={**kept, "rerun_of": number})
    study.tell(number, state=optuna.trial.TrialState.FAIL)


def _suggest(trial: Any, p: Param) -> Any:
    if p.choices is not None:
        return trial.suggest_categorical(p.key, list(p.choices))
    if p.integer:
        return trial.suggest_int(p.key, int(p.low), int(p.high), log=p.log)  # type: ignore[arg-type]
    return trial.suggest_float(p.key, p.low, p.high, log=p.log)


def _next_folder(study: Any) -> str:
    used = [
        int(t.user_attrs["folder"].rsplit("-", 1)[1])
        for t in study.get_trials(deepcopy=False)
        if "folder" in t.user_attrs
    ]
    return f"trial-{max(used, default=-1) + 1:03d}"


def _run_trial(
    optuna: Any,
    study: Any,
    spec: SweepSpec,
    out_dir: Path,
    done: int,
    stop: StopRequest | None,
    say: Callable[[str], None],
    quiet: bool,
) -> None:
    trial = study.ask()
    values = {p.key: _suggest(trial, p) for p in spec.params}
    folder = trial.user_attrs.get("folder") or _next_folder(study)
    trial.set_user_attr("folder", folder)
    shown = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
    say(f"trial {done + 1}/{spec.trials} ({out_dir / folder}): {shown}")
    failed = optuna.trial.TrialState.FAIL
    try:
        config = spec.trial_config(values)
    except UsageError as e:  # keys that disagree: this draw can never run
        _fail(study, trial, e, failed, say)
        return
    reporter = TrialReporter(trial, config.train.max_steps, config.train.max_seconds, spec.prune, quiet)
    started = time.perf_counter()
    try:
        summary = run_training(config, out_dir / folder, overwrite=True, reporter=reporter, stop=stop)
    except Pruned as e:
        trial.set_user_attr("stopped", str(e))
        trial.set_user_attr("wall_s", round(time.perf_counter() - started, 1))
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        say(f"  {e}")
    except (Interrupted, SaveFailed):
        _requeue(optuna, study, trial.number, values, {"folder": folder, **trial.user_attrs})
        raise
    except CharlmError as e:  # the run's own failure (diverged, a context too long for the corpus): it counts
        _fail(study, trial, e, failed, say)
    except BaseException:
        _requeue(optuna, study, trial.number, values, {"folder": folder, **trial.user_attrs})
        raise
    else:
        assert summary is not None  # a sweep runs in one process
        for key in ("full_val_loss", "best_val_loss", "steps", "tokens", "stop_reason"):
            trial.set_user_attr(key, getattr(summary, key))
        trial.set_user_attr("model_params", summary.params)
        trial.set_user_attr("wall_s", round(summary.wall_s, 1))
        study.tell(trial, summary.full_val_loss)
        best = study.best_trial
        say(f"  full-val {summary.full_val_loss:.4f}; best so far {best.value:.4f} ({best.user_attrs['folder']})")


def _fail(study: Any, trial: Any, e: CharlmError, failed: Any, say: Callable[[str], None]) -> None:
    message = (e.details[0] if e.details else str(e)) if isinstance(e, UsageError) else str(e)
    trial.set_user_attr("error", message)
    study.tell(trial, state=failed)
    say(f"  failed: {message}")


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------------------- results


def results_of(optuna: Any, study: Any, spec: SweepSpec, out_dir: Path) -> dict[str, Any]:
    """Every counted trial, ranked: completed by full-validation loss, then pruned by their last estimate, then
    failed; with what the sweep was."""
    state = optuna.trial.TrialState
    rows = []
    for t in study.get_trials(deepcopy=False):
        if not _counts(optuna, t):
            continue
        kind = {state.COMPLETE: "complete", state.PRUNED: "pruned"}.get(t.state, "failed")
        last = t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None
        rows.append(
            {
                "trial": t.number,
                "folder": str(out_dir / t.user_attrs.get("folder", "")),
                "state": kind,
                "params": t.params,
                "full_val_loss": t.value if kind == "complete" else None,
                "val_loss": t.user_attrs.get("best_val_loss", last),
                **{k: t.user_attrs.get(k) for k in ("steps", "wall_s", "model_params", "error", "stopped")},
            }
        )
    order = {"complete": 0, "pruned": 1, "failed": 2}
    rows.sort(key=lambda r: (order[r["state"]], r["full_val_loss"] or r["val_loss"] or float("inf"), r["trial"]))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    best = rows[0] if rows and rows[0]["state"] == "complete" else None
    reruns = sum(1 for t in study.get_trials(deepcopy=False) if t.state == state.FAIL and not _counts(optuna, t))
    return {
        "kind": KIND,
        "sweep_dir": str(out_dir),
        "spec": str(spec.path),
        "sampler": spec.sampler,
        "prune": spec.prune,
        "budget": {"seconds": spec.seconds, "steps": spec.steps},
        "swept": [p.describe() for p in spec.params],
        "trials_wanted": spec.trials,
        "trials_counted": len(rows),
        "trials_cut_short": reruns,
        "best": best,
        "best_config": str(out_dir / BEST_FILE) if best else None,
        "trials": rows,
    }


def _write_results(optuna: Any, study: Any, spec: SweepSpec, out_dir: Path) -> dict[str, Any]:
    results = results_of(optuna, study, spec, out_dir)
    text = json.dumps(results, indent=1) + "\n"
    atomic_write(out_dir / RESULTS_FILE, lambda f: f.write(text.encode()))
    return results


def _write_best(spec: SweepSpec, results: dict[str, Any], out_dir: Path) -> None:
    best = results["best"]
    if best is None:
        if results["trials"]:
            raise WorkError(f"no trial of the sweep completed (see {out_dir / RESULTS_FILE}); nothing to rank")
        return
    config = spec.trial_config(best["params"])
    path = out_dir / BEST_FILE
    head = (
        f"# charlm train --config {shell_path(path)}\n"
        f"# The best trial of the sweep {spec.path} ({best['folder']}: full-val {best['full_val_loss']:.4f}),\n"
        "# with the trial's budget: train longer with --max-seconds or --max-steps.\n"
    )
    text = head + config.to_yaml()
    atomic_write(path, lambda f: f.write(text.encode()))
