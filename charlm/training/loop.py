"""The training loop: maybe evaluate and save, lr for this step, micro-steps, clip, step, log; then the final pass.

The loop knows nothing about the model's internals (it calls model(x, y) -> (logits, loss) and model.parameters()),
nothing about the run folder (a RunFolder writes the checkpoints, config.yaml beside them) or the command line
(charlm.training.run, charlm.cli.app), and installs no signal handler: whoever runs it passes a StopRequest (the CLI's
charlm.cli.signals.StopSignals, or NeverStop from Python). Its state is one RunState, saved whole in every checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from charlm.config.schema import Config
from charlm.errors import CharlmError, Interrupted, UsageError, WorkError
from charlm.families.base import AnyCorpus
from charlm.families.registry import family_for
from charlm.hardware.device import (
    out_of_memory,
    precision_name,
    rng_state,
    seed_everything,
    set_rng_state,
    should_compile,
)
from charlm.hardware.distributed import Dist
from charlm.models.linear import onednn_linears, use_onednn
from charlm.progress import TrainReporter
from charlm.storage.checkpoint import load_checkpoint
from charlm.storage.run_folder import RunFolder
from charlm.storage.run_state import RunState, TrainSummary
from charlm.training.averaging import WeightAverage
from charlm.training.metrics import MetricsLog
from charlm.training.optim import make_optimizer
from charlm.training.schedule import LRSchedule
from charlm.training.setup import (
    NeverStop,
    StopRequest,
    compile_or_warn,
    peak_memory_mb,
    seed_for_rank,
    training_dtype,
)
from charlm.training.step import OptimizerStep


class Trainer:
    """A run's loop and everything it owns: optimizer, schedule, batches, periodic evaluation, metrics, the compile
    fallback, and the RunState that every checkpoint saves whole and the summary is built from."""

    def __init__(
        self,
        config: Config,
        model: nn.Module,
        corpus: AnyCorpus,
        device: torch.device,
        folder: RunFolder,
        reporter: TrainReporter,
        stop: StopRequest | None = None,
        dist: Dist | None = None,
        started: float | None = None,
    ):
        self.config, self.model, self.corpus, self.device = config, model, corpus, device
        self.folder, self.reporter, self.stop = folder, reporter, stop or NeverStop()
        self.dist = dist or Dist()
        self.started = time.perf_counter() if started is None else started  # the invocation's start, for wall_s
        tc = config.train
        cast(Any, model).label_smoothing = tc.label_smoothing  # the loss training minimises (evaluations: plain)
        self.amp_dtype = training_dtype(config, device)  # decided once: steps, evaluations and the final pass
        self.optimizer = make_optimizer(model, tc, device)
        self.schedule = LRSchedule(tc)
        self.scaler = torch.amp.GradScaler(device.type) if self.amp_dtype == torch.float16 else None
        self.metrics = MetricsLog(folder.path, config, enabled=self.dist.is_main)
        self.family = family_for(config)  # how this model's batches are made and scored
        self.scoring = self.family.periodic_losses(config, corpus, device, self.amp_dtype, self.dist)
        rank_seed = seed_for_rank(tc.seed, self.dist.rank)
        self.batches = self.family.batches(config, corpus, device, rank_seed)  # this rank's, as its family makes them
        global_batch = tc.batch_size * tc.grad_accum * self.dist.world_size
        self.state = RunState(lr=tc.lr, world_size=self.dist.world_size, global_batch=global_batch)
        self.elapsed_before = 0.0  # loop seconds of earlier invocations
        self.loop_start = time.perf_counter()  # reset when the loop begins; time-based schedules count from it
        self.step_tokens = 0  # tokens (target characters, for pairs) of this rank's last step
        self.stop_reason = ""  # why the loop ended: max_steps, max_seconds or early_stop
        # What the steps call: the model, wrapped in DistributedDataParallel under torchrun, then maybe compiled (a
        # compile that fails on the first step falls back to `uncompiled`: see _first_step_failed).
        self.uncompiled: nn.Module = model
        if self.dist.active:
            ids = [device.index] if device.type == "cuda" else None
            self.uncompiled = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        compiled = should_compile(device, tc.compile)
        self.forward = compile_or_warn(self.uncompiled, reporter) if compiled else self.uncompiled
        # oneDNN's float32 kernels for the linear layers: not under autocast, nor in a compiled step (torch's there)
        self.onednn = use_onednn(device, tc.cpu_linear) and self.amp_dtype is None and not compiled
        self.average = WeightAverage(model, tc.ema_decay) if tc.ema_decay else None
        self.stepper = OptimizerStep(
            config,
            model,
            self.uncompiled,
            self.batches,
            self.optimizer,
            self.scaler,
            device,
            self.amp_dtype,
            self.dist,
            self.average,
        )

    def resume(self, state: RunState, parts: dict[str, Any], source: Path) -> None:
        """Continue a saved run: its state and the optimizer's, schedule's, scaler's and random streams'."""
        world, batch = self.dist.world_size, self.state.global_batch
        self.state = replace(state, world_size=world, global_batch=batch, lr=state.lr or self.config.train.lr)
        self.elapsed_before = state.elapsed_s
        try:
            self.optimizer.load_state_dict(parts["optimizer"])
            group = self.optimizer.param_groups[-1]
            self.schedule.load_state_dict(parts["scheduler"], group["lr"] / group["lr_scale"])
            if self.scaler and parts["scaler"]:
                self.scaler.load_state_dict(parts["scaler"])
            self._load_rank_state(parts["ranks"])
            if self.average is not None:  # train.ema_decay cannot change on resume: the run saved its average
                self.average.load_state_dict(parts["average"])
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise UsageError(f"checkpoint {source} lacks a usable training state ({e}); it cannot be resumed") from None

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> TrainSummary | None:
        """Train until a limit, early stop or stop request, then score best.pt on the validation split. Returns the
        summary on rank 0 (None on the others); the metrics are closed however the run ends."""
        try:
            with onednn_linears(self.onednn):
                self._loop()
                if not self.dist.is_main:
                    return None
                summary = self._summary()
            self.metrics.finish(summary.to_dict())
            return summary
        finally:
            self.metrics.close()

    def _loop(self) -> None:
        tc, s = self.config.train, self.state
        first_step, loss = s.step, None
        self.loop_start = time.perf_counter()
        self.reporter.start(s.step, tc.max_steps or None, tc.max_seconds)
        try:
            while True:
                # The evaluation due at this step comes first, so that a stop or a time limit reached meanwhile
                # keeps it; a run that ends between two evaluations is evaluated and saved as it ends, by the same
                # code (one that ends on an evaluation step is not evaluated twice).
                due = (s.step % tc.eval_interval == 0 and s.step > first_step) or (tc.eval_at_start and s.step == 0)
                if due and self._evaluate(loss):
                    self.stop_reason = "early_stop"
                    break
                self.stop_reason = self._limit_reached()
                if self.stop_reason:
                    if not due:
                        self._evaluate(loss)
                    break
                s.lr = self.schedule.lr(s.step, time.perf_counter() - self.loop_start)
                loss = self._timed_step(first=s.step == first_step)
                self.reporter.step(s.step, loss, s.lr, s.tokens_per_s)
                if tc.log_interval and s.step % tc.log_interval == 0:
                    self.metrics.step(self._record(loss))
        except KeyboardInterrupt:  # Python callers (a notebook's Ctrl-C): keep what was trained, then propagate
            if s.step > first_step and not self.dist.active:
                self._save("last.pt")
            raise
        finally:
            self.reporter.close()

    def _record(self, step_loss: torch.Tensor | None, **figures: float) -> dict:
        """What the loggers get: this step's figures (reading the loss is a device sync: only when logging)."""
        s = self._clock()
        return {
            "step": s.step,
            "tokens": s.tokens,
            "step_loss": None if step_loss is None else step_loss.item(),
            "lr": s.lr,
            "tokens_per_s": s.tokens_per_s,
            "time": time.time(),
            "elapsed_s": s.elapsed_s,
            **figures,
        }

    def _clock(self) -> RunState:
        """The state with elapsed_s brought up to now: seconds in the loop, over all invocations."""
        self.state.elapsed_s = self.elapsed_before + time.perf_counter() - self.loop_start
        return self.state

    def _limit_reached(self) -> str:
        """'max_steps', 'max_seconds' or '' — the same on every rank; a stop request saves and raises here."""
        tc, s = self.config.train, self.state
        if tc.max_steps and s.step >= tc.max_steps:
            return "max_steps"
        time_up = bool(tc.max_seconds) and time.perf_counter() - self.loop_start >= tc.max_seconds
        signum = self.stop.requested or 0
        if self.dist.active:  # no rank stops alone and leaves the others hanging
            flags = self.dist.max_(torch.tensor([float(time_up), float(signum)], device=self.device))
            time_up, signum = bool(flags[0].item()), int(flags[1].item())
        if signum:
            saved = self._save("last.pt")
            name = signal.Signals(signum).name
            raise Interrupted(f"{name} received: stopped at step {s.step} and saved {saved}", signum, saved=saved)
        return "max_seconds" if time_up else ""

    def _timed_step(self, first: bool) -> torch.Tensor:
        s = self.state
        t0 = time.perf_counter()
        try:
            loss, self.step_tokens = self.stepper.step(self.forward, s.lr, s.step)
        except CharlmError:
            raise
        except Exception as e:  # compiler errors come in many types (BackendCompilerFailed, InductorError, ...)
            if not first:
                raise
            loss = self._first_step_failed(e)
        dt = time.perf_counter() - t0
        if self.stop.requested is not None and first:  # a stop asked for while the first step ran: nothing to keep
            raise self._stopped_before_training()
        self.stop.arm()
        if first:
            self.folder.begin()  # trained: the run being overwritten goes now, not before
        per_step_tokens = self.step_tokens * self.dist.world_size  # pairs: rank 0's count stands for each rank's
        s.step += 1
        s.tokens += per_step_tokens
        if first and self.forward is not self.uncompiled:
            s.compile_s = dt  # the first compiled step includes compilation: report it apart
        else:
            s.train_s += dt
            s.timed_tokens += per_step_tokens
        return loss

    def _first_step_failed(self, e: Exception) -> torch.Tensor:
        """The first step failed: out of memory is the user's to fix (a smaller batch or context); torch.compile,
        which fails lazily at the first call, falls back to eager with a warning, never a crash."""
        if out_of_memory(e):
            raise self._no_memory_for_a_step() from None
        if self.forward is self.uncompiled:  # not the compiler's: eager fails the same way
            raise e
        if self.stop.requested is not None:  # a stop request, wrapped by the compiler
            raise self._stopped_before_training() from None
        self.reporter.warn(f"torch.compile failed ({type(e).__name__}); training without it")
        self.forward = self.uncompiled
        self.optimizer.zero_grad(set_to_none=True)
        try:
            loss, self.step_tokens = self.stepper.step(self.forward, self.state.lr, self.state.step)
        except RuntimeError as eager_error:
            if out_of_memory(eager_error):
                raise self._no_memory_for_a_step() from None
            raise
        return loss

    def _no_memory_for_a_step(self) -> UsageError:
        b, t = self.config.train.batch_size, self.config.model.block_size
        return UsageError(
            f"not enough memory on {self.device} for a step of {b:,} windows x {t:,} characters: choose a "
            "smaller train.batch_size (train.grad_accum keeps the batch) or model.block_size"
        )

    # -- evaluation and checkpoints --------------------------------------------------------

    def _evaluate(self, step_loss: torch.Tensor | None) -> bool:
        """Score, log, checkpoint (best.pt when the estimate improved, last.pt always); True when early stopping
        should end the run."""
        t0 = time.perf_counter()
        tc, s = self.config.train, self.state
        # With train.ema_decay the average is the model the run hands over (best.pt, the final pass), so it is the
        # one scored and chosen; the training weights go on from where they were.
        with self.average.in_model() if self.average is not None else contextlib.nullcontext():
            train, val = self.scoring.losses(self.model, s.step)
            # non-finite weights after the last step: save nothing
            if not (math.isfinite(val) and math.isfinite(train)):
                raise WorkError(
                    f"loss became {val} at step {s.step} (evaluation); training stopped without saving, the last "
                    "checkpoints are untouched (try a lower train.lr or train.grad_clip)"
                )
            accuracy = self.scoring.accuracy(self.model) if tc.best_by == "accuracy" else None
            self.folder.begin()  # scored: train.eval_at_start's first record and checkpoint come before any step
            improved = val < s.best_val_loss if accuracy is None else accuracy > s.best_val_accuracy
            s.best_val_loss = min(val, s.best_val_loss)
            s.best_val_accuracy = max(accuracy if accuracy is not None else -1.0, s.best_val_accuracy)
            s.evals_since_best = 0 if improved else s.evals_since_best + 1
            if self.schedule.observe(val, s.step):  # the plateau rule lowered the lr: log the new one
                s.lr = self.schedule.lr(s.step, time.perf_counter() - self.loop_start)
            chosen_by = {} if accuracy is None else {"val_accuracy": accuracy}
            record = self._record(step_loss, train_loss=train, val_loss=val, **chosen_by)
            self.metrics.evaluation(record)
            if improved:
                self._save("best.pt")
        self._save("last.pt")
        s.eval_s += time.perf_counter() - t0
        self.reporter.evaluation(s.step, train, val, s.lr, s.tokens_per_s, s.elapsed_s, improved, accuracy)
        return bool(tc.early_stop_patience) and s.evals_since_best >= tc.early_stop_patience

    def _save(self, name: str) -> Path:
        """Every rank takes part (each rank's random streams are gathered); rank 0's folder writes."""
        ranks = self.dist.gather({"rng": rng_state(), "sampler": self.batches.state_dict()})
        parts = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "ranks": ranks,
            "average": self.average.state_dict() if self.average is not None else None,
        }
        return self.folder.save(name, self.model, self._clock(), parts)

    def _summary(self) -> TrainSummary:
        """The run's state and the final validation pass of best.pt."""
        best = load_checkpoint(self.folder.path / "best.pt").build_model(self.device)
        full, whole = self.family.final_pass(best, self.corpus, self.config, self.device, self.amp_dtype)
        return TrainSummary.of(
            self.state,
            self.stop_reason,
            full,
            whole,
            self.corpus.tokenizer.unit,
            wall_s=time.perf_counter() - self.started,
            params=sum(p.numel() for p in self.model.parameters()),
            device=str(self.device),
            out_dir=str(self.folder.path),
            peak_memory_mb=peak_memory_mb(self.device),
            precision=precision_name(self.amp_dtype),
            linear_kernels="onednn" if self.onednn else "torch",
            unseen_chars={path: n._asdict() for path, n in getattr(self.corpus, "unknown_counts", {}).items()},
        )

    def _load_rank_state(self, ranks: list[dict]) -> None:
        if len(ranks) == self.dist.world_size:
            set_rng_state(ranks[self.dist.rank]["rng"])
            self.batches.load_state_dict(ranks[self.dist.rank]["sampler"])
            return
        # Another world size: each rank's streams are re-derived from the seed, its rank and the step. Training
        # goes on from the same weights and optimizer state, with fresh batches: statistically the same run,
        # not step-for-step identical to either world size.
        fresh = seed_for_rank(self.config.train.seed, self.dist.rank) + self.state.step
        seed_everything(fresh)
        self.batches.generator.manual_seed(fresh)
        self.reporter.info(
            f"world size changed from {len(ranks)} to {self.dist.world_size}: batch and dropout "
            "streams re-derived (the run continues, not step-for-step identically)"
        )

    def _stopped_before_training(self) -> Interrupted:
        signum = self.stop.requested or signal.SIGINT
        name = signal.Signals(signum).name
        return Interrupted(f"{name} received before training started; nothing was written", signum)
