"""The training loop: lr for this step, maybe evaluate and save, micro-steps, clip, step, log.

The loop knows nothing about the model's internals (it calls model(x, y) -> (logits, loss) and model.parameters()),
nothing about the run folder's policy or the command line (charlm.run), and installs no signal handler: whoever
runs it passes a StopRequest (the CLI's charlm.signals.StopSignals, or NeverStop from Python).
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from pathlib import Path
from typing import Protocol, cast

import torch
from torch import nn

from charlm.checkpoint import TrainingState, save_training_checkpoint
from charlm.config import Config
from charlm.data import Corpus, RandomWindows, fixed_windows
from charlm.device import autocast, autocast_dtype, rng_state, seed_everything, set_rng_state, should_compile
from charlm.distributed import Dist
from charlm.errors import CharlmError, Interrupted, UsageError, WorkError
from charlm.evaluate import windows_total
from charlm.files import atomic_write
from charlm.masked import EncoderOnly, MaskedWindows, masked_score
from charlm.metrics import MetricsLog
from charlm.optim import make_optimizer
from charlm.pairs import Pair, PairBatches, PairCorpus, pairs_total
from charlm.progress import TrainReporter
from charlm.schedule import LRSchedule


class StopRequest(Protocol):
    """How a caller asks the loop to stop: `requested` holds a signal number; `arm()` marks the first step done."""

    requested: int | None

    def arm(self) -> None: ...


class NeverStop:
    """The library's default: no signal handling at all (a notebook's Ctrl-C raises KeyboardInterrupt as usual)."""

    requested: int | None = None

    def arm(self) -> None:
        pass


def compile_or_warn(model: nn.Module, reporter: TrainReporter) -> nn.Module:
    try:
        return cast(nn.Module, torch.compile(model))
    except Exception as e:  # compile support varies by platform; eager always works
        reporter.warn(f"torch.compile unavailable ({type(e).__name__}: {e}); training without it")
        return model


def seed_for_rank(seed: int, rank: int) -> int:
    """Each rank's own batch and dropout streams; rank 0's is the single-process one."""
    return seed + 1_000_003 * rank


class Trainer:
    def __init__(
        self,
        config: Config,
        model: nn.Module,
        corpus: Corpus | PairCorpus,
        device: torch.device,
        out_dir: Path,
        reporter: TrainReporter,
        stop: StopRequest | None = None,
        dist: Dist | None = None,
    ):
        self.config, self.model, self.corpus, self.device = config, model, corpus, device
        self.out_dir, self.reporter, self.stop = out_dir, reporter, stop or NeverStop()
        self.dist = dist or Dist()
        tc = config.train
        self.amp_dtype = autocast_dtype(device, tc.dtype)
        self.optimizer = make_optimizer(model, tc, device)
        self.schedule = LRSchedule(tc)
        self.scaler = torch.amp.GradScaler(device.type) if self.amp_dtype == torch.float16 else None
        self.metrics = MetricsLog(out_dir, config, enabled=self.dist.is_main)
        T, rank_seed = config.model.block_size, seed_for_rank(tc.seed, self.dist.rank)
        self.sampler: RandomWindows | PairBatches
        if isinstance(corpus, PairCorpus):  # pairs: the first eval_windows lines of each (shuffled) split
            self.sampler = PairBatches(corpus.train, tc.batch_size, device, rank_seed)
        else:
            self.sampler = (
                MaskedWindows(corpus.train, T, tc.batch_size, device, rank_seed, corpus.tokenizer.vocab_size)
                if config.model.arch == "encoder"
                else RandomWindows(corpus.train, T, tc.batch_size, device, rank_seed)
            )
            # Fixed windows: every periodic evaluation scores the same text, so the plateau rule sees signal.
            self.val_starts = fixed_windows(corpus.val, T, tc.eval_windows, seed=tc.seed + 1)
            self.train_starts = fixed_windows(corpus.train, T, tc.eval_windows, seed=tc.seed + 2)
        self.step = self.tokens = self.evals_since_best = 0
        self.best_val = math.inf
        self.elapsed_before = 0.0  # training seconds in earlier invocations
        self.train_s = self.eval_s = self.compile_s = 0.0  # this invocation's
        self.timed_tokens = 0  # tokens of the steps counted in train_s
        self.step_tokens = 0  # tokens (target characters, for pairs) of this rank's last step
        self.lr = tc.lr
        self.run_start = time.perf_counter()  # reset when run() begins; time-based schedules count from it
        self.config_written = False
        # What the steps call: the model, wrapped in DistributedDataParallel under torchrun, then maybe compiled (the
        # trainer owns the fallback: a compile that fails on the first step goes back to `uncompiled`).
        self.uncompiled: nn.Module = model
        if self.dist.active:
            ids = [device.index] if device.type == "cuda" else None
            self.uncompiled = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        compiled = should_compile(device, tc.compile)
        self.forward = compile_or_warn(self.uncompiled, reporter) if compiled else self.uncompiled

    @property
    def global_batch(self) -> int:
        """Windows per optimizer step over all ranks: micro batch x accumulation x world size."""
        return self.config.train.batch_size * self.config.train.grad_accum * self.dist.world_size

    @property
    def tokens_per_s(self) -> float:
        return self.timed_tokens / self.train_s if self.train_s > 0 else 0.0

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> str:
        """Train until a limit, early stop or stop request; evaluate at the end. Returns why it stopped."""
        tc = self.config.train
        first_step, last_eval, reason, loss = self.step, self.step, "", None
        self.run_start = time.perf_counter()
        self.reporter.start(self.step, tc.max_steps or None, tc.max_seconds)
        try:
            if tc.eval_at_start and self.step == 0:
                self._evaluate(None)
            while not reason:
                reason = self._limit_reached()
                if reason:
                    break
                self.lr = self.schedule.lr(self.step, time.perf_counter() - self.run_start)
                loss = self._timed_step(first=self.step == first_step)
                self.reporter.step(self.step, loss, self.lr, self.tokens_per_s)
                if tc.log_interval and self.step % tc.log_interval == 0:
                    self.metrics.step(self._record(loss))
                if self.step % tc.eval_interval == 0:
                    last_eval = self.step
                    reason = "early_stop" if self._evaluate(loss) else ""
            if last_eval != self.step or self.step == first_step:
                self._evaluate(loss)
        except KeyboardInterrupt:  # Python callers (a notebook's Ctrl-C): keep what was trained, then propagate
            if self.step > first_step and not self.dist.active:
                self._save("last.pt")
            raise
        finally:
            self.reporter.close()
        return reason

    def _record(self, step_loss: torch.Tensor | None, **figures: float) -> dict:
        """What the loggers get: this step's figures (reading the loss is a device sync: only when logging)."""
        return {
            "step": self.step,
            "tokens": self.tokens,
            "step_loss": None if step_loss is None else step_loss.item(),
            "lr": self.lr,
            "tokens_per_s": self.tokens_per_s,
            "time": time.time(),
            "elapsed_s": self.elapsed_before + time.perf_counter() - self.run_start,
            **figures,
        }

    def _limit_reached(self) -> str:
        """'max_steps', 'max_seconds' or '' — the same on every rank; a stop request saves and raises here."""
        tc = self.config.train
        if tc.max_steps and self.step >= tc.max_steps:
            return "max_steps"
        time_up = bool(tc.max_seconds) and time.perf_counter() - self.run_start >= tc.max_seconds
        signum = self.stop.requested or 0
        if self.dist.active:  # no rank stops alone and leaves the others hanging
            flags = self.dist.max_(torch.tensor([float(time_up), float(signum)], device=self.device))
            time_up, signum = bool(flags[0].item()), int(flags[1].item())
        if signum:
            self._save("last.pt")
            raise Interrupted(self._interrupt_message(signum), signum)
        return "max_seconds" if time_up else ""

    def _timed_step(self, first: bool) -> torch.Tensor:
        t0 = time.perf_counter()
        loss = self._first_step() if first else self._optimizer_step()
        dt = time.perf_counter() - t0
        if self.stop.requested is not None and first:  # a stop asked for while the first step ran: nothing to keep
            raise self._stopped_before_training()
        self.stop.arm()
        per_step_tokens = self.step_tokens * self.dist.world_size  # pairs: rank 0's count stands for each rank's
        self.step += 1
        self.tokens += per_step_tokens
        if first and self.forward is not self.uncompiled:
            self.compile_s = dt  # the first compiled step includes compilation: report it apart
        else:
            self.train_s += dt
            self.timed_tokens += per_step_tokens
        return loss

    def _first_step(self) -> torch.Tensor:
        """torch.compile fails lazily, at the first call: fall back to eager with a warning, never a crash."""
        if self.forward is self.uncompiled:
            return self._optimizer_step()
        try:
            return self._optimizer_step()
        except CharlmError:
            raise
        except Exception as e:  # compiler errors come in many types (BackendCompilerFailed, InductorError, ...)
            if self.stop.requested is not None:  # a stop request, wrapped by the compiler
                raise self._stopped_before_training() from None
            self.reporter.warn(f"torch.compile failed ({type(e).__name__}); training without it")
            self.forward = self.uncompiled
            self.optimizer.zero_grad(set_to_none=True)
            return self._optimizer_step()

    def _optimizer_step(self) -> torch.Tensor:
        tc = self.config.train
        self.optimizer.set_lr(self.lr)
        loss_sum = torch.zeros((), device=self.device)
        self.step_tokens = 0
        for micro in range(tc.grad_accum):
            x, y = self.sampler.next_batch()  # text: windows (B, T); pairs: (sources, BOS + targets)
            inputs = x if isinstance(x, tuple) else (x,)
            self.step_tokens += self.sampler.last_tokens if isinstance(self.sampler, PairBatches) else y.numel()
            sync = not self.dist.active or micro == tc.grad_accum - 1  # DDP all-reduces on the last micro-step only
            with (
                contextlib.nullcontext()
                if sync
                else cast(nn.parallel.DistributedDataParallel, self.uncompiled).no_sync()
            ):
                with autocast(self.device, self.amp_dtype):
                    _, loss = self.forward(*inputs, y)
                loss = loss / tc.grad_accum
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        if self.dist.active:  # every rank sees the same mean loss, so all stop together if it is not finite
            self.dist.sum_(loss_sum).div_(self.dist.world_size)
        if not torch.isfinite(loss_sum):  # stop before the optimizer step, so no weight is touched
            raise WorkError(
                f"loss became {loss_sum.item()} at step {self.step + 1}; training stopped before "
                "updating the weights, the last checkpoints are untouched (try a lower train.lr or train.grad_clip)"
            )
        optimizers = self.optimizer.optimizers
        if tc.grad_clip:
            if self.scaler:
                for opt in optimizers:
                    self.scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
        if self.scaler:
            for opt in optimizers:
                self.scaler.step(opt)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum

    # -- evaluation and checkpoints --------------------------------------------------------

    def _evaluate(self, step_loss: torch.Tensor | None) -> bool:
        """Score the fixed windows, log, checkpoint; True when early stopping should end the run."""
        t0 = time.perf_counter()
        tc = self.config.train
        if isinstance(self.corpus, PairCorpus):
            val = self._pairs_loss(self.corpus.val[: tc.eval_windows])
            train = self._pairs_loss(self.corpus.train[: tc.eval_windows])
        else:
            val_starts, train_starts = self.val_starts, self.train_starts
            if tc.eval_sampling == "random":  # fresh windows from the seed and the step: a resume draws the same
                T, n = self.config.model.block_size, tc.eval_windows
                val_starts = fixed_windows(self.corpus.val, T, n, seed=tc.seed + 3 + 2 * self.step)
                train_starts = fixed_windows(self.corpus.train, T, n, seed=tc.seed + 4 + 2 * self.step)
            val = self._windows_loss(self.corpus.val, val_starts)
            train = self._windows_loss(self.corpus.train, train_starts)
        if not (math.isfinite(val) and math.isfinite(train)):  # the last step left non-finite weights: save nothing
            raise WorkError(
                f"loss became {val} at step {self.step} (evaluation); training stopped without saving, the last "
                "checkpoints are untouched (try a lower train.lr or train.grad_clip)"
            )
        improved = val < self.best_val
        self.best_val = min(val, self.best_val)
        self.evals_since_best = 0 if improved else self.evals_since_best + 1
        if self.schedule.observe(val, self.step):  # the plateau rule lowered the lr: log the new one
            self.lr = self.schedule.lr(self.step, time.perf_counter() - self.run_start)
        record = self._record(step_loss, train_loss=train, val_loss=val)
        self.metrics.evaluation(record)
        if improved:
            self._save("best.pt")
        self._save("last.pt")
        self.eval_s += time.perf_counter() - t0
        self.reporter.evaluation(self.step, train, val, self.lr, self.tokens_per_s, record["elapsed_s"], improved)
        return bool(tc.early_stop_patience) and self.evals_since_best >= tc.early_stop_patience

    def _windows_loss(self, ids: torch.Tensor, starts: torch.Tensor) -> float:
        """Mean loss on fixed windows; under DDP each rank scores its share and the sums are added up."""
        d = self.dist
        if isinstance(self.model, EncoderOnly):  # the loss of restoring hidden characters (hidden alike each time)
            total, _, count = masked_score(
                self.model, ids, starts[d.rank :: d.world_size], self.device, amp_dtype=self.amp_dtype
            )
            both = d.sum_(torch.tensor([total, float(count)], dtype=torch.float64, device=self.device))
            return (both[0] / both[1]).item()
        total, count = windows_total(
            self.model,
            ids,
            starts[d.rank :: d.world_size],
            self.config.model.block_size,
            self.device,
            amp_dtype=self.amp_dtype,
        )
        both = d.sum_(torch.tensor([total, float(count)], dtype=torch.float64, device=self.device))
        return (both[0] / both[1]).item()

    def _pairs_loss(self, pairs: list[Pair]) -> float:
        """Mean loss per target character on fixed lines; under DDP each rank scores its share."""
        d = self.dist
        total, count = pairs_total(self.model, pairs[d.rank :: d.world_size], self.device, amp_dtype=self.amp_dtype)
        both = d.sum_(torch.tensor([total, float(count)], dtype=torch.float64, device=self.device))
        return (both[0] / both[1]).item()

    def training_state(self) -> TrainingState:
        """Every rank takes part: it gathers each rank's random streams."""
        return TrainingState(
            step=self.step,
            tokens=self.tokens,
            best_val_loss=self.best_val,
            evals_since_best=self.evals_since_best,
            elapsed_s=self.elapsed_before + self.train_s + self.eval_s,
            optimizer=self.optimizer.state_dict(),
            scheduler=self.schedule.state_dict(),
            scaler=self.scaler.state_dict() if self.scaler else None,
            world_size=self.dist.world_size,
            global_batch=self.global_batch,
            ranks=self.dist.gather({"rng": rng_state(), "sampler": self.sampler.state_dict()}),
        )

    def load_training_state(self, state: TrainingState, source: Path) -> None:
        self.step, self.tokens = state.step, state.tokens
        self.best_val, self.evals_since_best = state.best_val_loss, state.evals_since_best
        self.elapsed_before = state.elapsed_s
        try:
            self.optimizer.load_state_dict(state.optimizer)
            group = self.optimizer.param_groups[-1]
            self.schedule.load_state_dict(state.scheduler, group["lr"] / group["lr_scale"])
            if self.scaler and state.scaler:
                self.scaler.load_state_dict(state.scaler)
            self._load_rank_state(state.ranks)
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise UsageError(f"checkpoint {source} lacks a usable training state ({e}); it cannot be resumed") from None

    def _load_rank_state(self, ranks: list[dict]) -> None:
        if len(ranks) == self.dist.world_size:
            set_rng_state(ranks[self.dist.rank]["rng"])
            self.sampler.load_state_dict(ranks[self.dist.rank]["sampler"])
            return
        # Another world size: each rank's streams are re-derived from the seed, its rank and the step. Training
        # goes on from the same weights and optimizer state, with fresh batches: statistically the same run,
        # not step-for-step identical to either world size.
        fresh = seed_for_rank(self.config.train.seed, self.dist.rank) + self.step
        seed_everything(fresh)
        self.sampler.generator.manual_seed(fresh)
        self.reporter.info(
            f"world size changed from {len(ranks)} to {self.dist.world_size}: batch and dropout "
            "streams re-derived (the run continues, not step-for-step identically)"
        )

    def _save(self, name: str) -> None:
        training = self.training_state()
        if not self.dist.is_main:
            return
        try:
            if not self.config_written:  # with the first checkpoint, so that nothing is written before training
                atomic_write(self.out_dir / "config.yaml", lambda f: f.write(self.config.to_yaml().encode()))
                self.config_written = True
            save_training_checkpoint(self.out_dir / name, self.config, self.corpus.tokenizer, self.model, training)
        except OSError as e:
            raise WorkError(
                f"could not write checkpoint {self.out_dir / name}: {e.strerror or e}; the previous checkpoint is "
                "untouched (free some disk space, then `charlm train --resume`)"
            ) from e

    def _stopped_before_training(self) -> Interrupted:
        signum = self.stop.requested or signal.SIGINT
        name = signal.Signals(signum).name
        return Interrupted(f"{name} received before training started; nothing was written", signum)

    def _interrupt_message(self, signum: int) -> str:
        name = signal.Signals(signum).name
        return (
            f"{name} received: stopped at step {self.step} and saved {self.out_dir / 'last.pt'}; "
            f"continue with `charlm train --resume --out-dir {self.out_dir}`"
        )
