"""The training loop: AdamW, warmup then ReduceLROnPlateau (or a decay), periodic evaluation, checkpoints, limits.

The loop knows nothing about the model's internals: it calls model(x, y) -> (logits, loss) and model.parameters().
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from charlm.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from charlm.files import atomic_write, remove_stale_temps
from charlm.config import Config
from charlm.data import BatchSampler, Corpus, fixed_windows
from charlm.device import (
    autocast, autocast_dtype, configure_backends, pick_device, rng_state, seed_everything, set_rng_state,
    should_compile,
)
from charlm.errors import CharlmError, Interrupted, UsageError, WorkError
from charlm.distributed import Dist, setup, teardown
from charlm.evaluate import full_pass, windows_total
from charlm.model import GPT
from charlm.progress import TrainReporter

RUN_FILES = ("last.pt", "best.pt", "metrics.jsonl", "config.yaml")
# Keys that may change when resuming: limits and schedule knobs. Anything else would silently
# make the resumed run a different run.
RESUMABLE_KEYS = {
    "train.max_steps", "train.max_seconds", "train.eval_interval", "train.early_stop_patience",
    "train.plateau_patience", "train.plateau_factor", "train.min_lr", "train.grad_clip", "train.device",
    "train.compile", "train.lr_schedule", "data.path",
}


@dataclass
class TrainSummary:
    best_val_loss: float  # best periodic validation estimate (nats/char)
    full_val_loss: float  # full validation pass of best.pt (nats/char)
    full_val_bpc: float
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


# ---------------------------------------------------------------------------- run folder


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
    for name in ("last.pt", "best.pt"):
        remove_stale_temps(out_dir / name)


def resume_config(saved: Config, settings_changed: dict[str, Any]) -> Config:
    """The checkpoint's config with the allowed run-limit and schedule changes applied."""
    errors = []
    for key, value in settings_changed.items():
        if key.startswith("model."):
            errors.append(f"{key} cannot change when resuming (the model's shape is fixed); start a new run instead")
        elif key not in RESUMABLE_KEYS:
            errors.append(f"{key} cannot change when resuming; allowed: {', '.join(sorted(RESUMABLE_KEYS))}")
    if errors:
        raise UsageError(errors[0], details=errors[1:] and errors)
    for key, value in settings_changed.items():
        section, name = key.split(".", 1)
        setattr(getattr(saved, section), name, value)
    return saved


# ---------------------------------------------------------------------------- the trainer


class StopFlag:
    """SIGINT/SIGTERM handling for a training run.

    Before the first step (start-up, data, compilation) a signal ends the run at once: nothing is worth saving yet.
    Once armed, the handler only sets this flag and the loop acts on it at the next step boundary, saving first; a
    second signal during that save changes nothing.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False
        self.cleanup: Any = None  # called before an immediate exit (removes a run folder we created, if empty)
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (e.g. called from a test thread)
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if not self.armed:
            self._exit_now()

    def _exit_now(self) -> None:
        """Before the first step there is nothing to save, and torch.compile would swallow an exception raised
        here and carry on compiling for many seconds: say why, tidy up, and leave at once."""
        sys.stderr.write(f"error: {self.early_exit()}\n")
        sys.stderr.flush()
        if self.cleanup is not None:
            self.cleanup()
        os._exit(128 + self.signum)

    def early_exit(self) -> Interrupted:
        name = signal.Signals(self.signum).name
        return Interrupted(f"{name} received before training started; nothing was written", self.signum)

    def restore(self) -> None:
        if self.signum is not None:
            return  # leaving because of a signal: keep ignoring repeats (a second Ctrl-C) until the process exits
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def seed_for_rank(seed: int, rank: int) -> int:
    """Each rank's own batch and dropout streams; rank 0's is the single-process one."""
    return seed + 1_000_003 * rank


class Trainer:
    def __init__(self, config: Config, model: GPT, corpus: Corpus, device: torch.device, out_dir: Path,
                 reporter: TrainReporter, stop: StopFlag, dist: Dist | None = None):
        self.config, self.model, self.corpus, self.device = config, model, corpus, device
        self.out_dir, self.reporter, self.stop = out_dir, reporter, stop
        self.dist = dist or Dist()
        tc = config.train
        self.amp_dtype = autocast_dtype(device, tc.dtype)
        self.optimizer = make_optimizer(model, tc.lr, tc.weight_decay, (tc.beta1, tc.beta2), device)
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.optimizer, mode="min", factor=tc.plateau_factor, patience=tc.plateau_patience, min_lr=tc.min_lr
        )
        self.scaler = torch.amp.GradScaler(device.type) if self.amp_dtype == torch.float16 else None
        T = config.model.block_size
        self.sampler = BatchSampler(corpus.train, T, tc.batch_size, device, seed=seed_for_rank(tc.seed, self.dist.rank))
        # Fixed windows: every periodic evaluation scores the same text, so the plateau scheduler sees signal, not noise.
        self.val_starts = fixed_windows(corpus.val, T, tc.eval_windows, seed=tc.seed + 1)
        self.train_starts = fixed_windows(corpus.train, T, tc.eval_windows, seed=tc.seed + 2)
        self.step = 0
        self.tokens = 0
        self.best_val = math.inf
        self.evals_since_best = 0
        self.elapsed_before = 0.0  # training seconds in earlier invocations
        self.train_s = self.eval_s = self.compile_s = 0.0  # this invocation's
        self.timed_tokens = 0  # tokens of the steps counted in train_s
        self.config_written = False
        self.tb = None  # TensorBoard writer, opened at the first evaluation when train.tensorboard is on
        self.last_loss: torch.Tensor | None = None  # the latest step's training loss (logged with evaluations)
        self.run_start = time.perf_counter()  # reset when run() begins; time-based schedules count from it
        # What the steps call: the model, wrapped in DistributedDataParallel under torchrun, maybe compiled.
        self.eager = model
        if self.dist.active:
            ids = [device.index] if device.type == "cuda" else None
            self.eager = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        self.forward = self.eager

    @property
    def global_batch(self) -> int:
        """Windows per optimizer step over all ranks: micro batch x accumulation x world size."""
        return self.config.train.batch_size * self.config.train.grad_accum * self.dist.world_size

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "vocab": self.corpus.tokenizer.chars,
            "model": self.model.state_dict(),  # the unwrapped model: no _orig_mod. prefixes
            "step": self.step,
            "tokens": self.tokens,
            "best_val_loss": self.best_val,
            "evals_since_best": self.evals_since_best,
            "elapsed_s": self.elapsed_before + self.train_s + self.eval_s,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.plateau.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "world_size": self.dist.world_size,
            "global_batch": self.global_batch,
            # every rank's random streams, so that a resume with the same world size continues each one exactly
            "ranks": self.dist.gather({"rng": rng_state(), "sampler": self.sampler.state_dict()}),
        }

    def load_state_dict(self, ckpt: Checkpoint) -> None:
        s = ckpt.state
        self.step, self.tokens = int(s["step"]), int(s.get("tokens", 0))
        self.best_val, self.evals_since_best = float(s["best_val_loss"]), int(s.get("evals_since_best", 0))
        self.elapsed_before = float(s.get("elapsed_s", 0.0))
        try:
            self.optimizer.load_state_dict(s["optimizer"])
            self.plateau.load_state_dict(s["scheduler"])
            if self.scaler and s.get("scaler"):
                self.scaler.load_state_dict(s["scaler"])
            self._load_rank_state(s["ranks"])
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise UsageError(f"checkpoint {ckpt.path} lacks a usable training state ({e}); it cannot be resumed") from None
        tc = self.config.train  # schedule knobs may have been changed with --set on resume
        self.plateau.factor, self.plateau.patience = tc.plateau_factor, tc.plateau_patience
        self.plateau.min_lrs = [tc.min_lr] * len(self.optimizer.param_groups)

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
        self.reporter.info(f"world size changed from {len(ranks)} to {self.dist.world_size}: batch and dropout "
                           "streams re-derived (the run continues, not step-for-step identically)")

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> str:
        """Train until a limit, early stop or signal; evaluate at the end. Returns why it stopped."""
        tc = self.config.train
        first_step, last_eval = self.step, self.step
        per_step_tokens = self.global_batch * self.config.model.block_size
        start = self.run_start = time.perf_counter()
        self.reporter.start(self.step, tc.max_steps or None)
        reason = "max_steps"
        try:
            while True:
                if tc.max_steps and self.step >= tc.max_steps:
                    break
                time_up, signum = self._agreed_stop(start)
                if signum:
                    self._save("last.pt")
                    raise Interrupted(self._interrupt_message(signum), signum)
                if time_up:
                    reason = "max_seconds"
                    break
                t0 = time.perf_counter()
                loss = self._first_step() if self.step == first_step else self._optimizer_step()
                dt = time.perf_counter() - t0
                if not self.stop.armed and self.stop.signum is not None:
                    # Signalled before the first step finished (torch.compile can swallow the handler's
                    # exception): leave without writing anything.
                    raise self.stop.early_exit()
                self.stop.armed = True
                self.step += 1
                self.tokens += per_step_tokens
                if self.step == first_step + 1 and self.forward is not self.eager:
                    self.compile_s = dt  # the first compiled step includes compilation: report it apart
                else:
                    self.train_s += dt
                    self.timed_tokens += per_step_tokens
                if self.reporter.bar is not None and (self.step % 10 == 0 or self.step == first_step + 1):
                    self.reporter.step(self.step, loss.item(), self.lr, self.tokens_per_s)
                self.last_loss = loss
                if self.step % tc.eval_interval == 0:
                    last_eval = self.step
                    if self._evaluate(start):
                        reason = "early_stop"
                        break
            if last_eval != self.step or self.step == first_step:
                self._evaluate(start)
        finally:
            self.reporter.close()
        return reason

    def _first_step(self) -> torch.Tensor:
        """torch.compile fails lazily, at the first call: fall back to eager with a warning, never a crash."""
        if self.forward is self.eager:
            return self._optimizer_step()
        try:
            return self._optimizer_step()
        except CharlmError:
            raise
        except Exception as e:  # compiler errors come in many types (BackendCompilerFailed, InductorError, ...)
            if self.stop.signum is not None:  # our signal, wrapped by the compiler
                raise self.stop.early_exit() from None
            self.reporter.warn(f"torch.compile failed ({type(e).__name__}); training without it")
            self.forward = self.eager
            self.optimizer.zero_grad(set_to_none=True)
            return self._optimizer_step()

    def _agreed_stop(self, start: float) -> tuple[bool, int]:
        """(time is up, signal number or 0), the same on every rank: no rank stops alone and leaves others hanging."""
        tc = self.config.train
        time_up = bool(tc.max_seconds) and time.perf_counter() - start >= tc.max_seconds
        if not self.dist.active:
            return time_up, self.stop.signum or 0
        flags = torch.tensor([float(time_up), float(self.stop.signum or 0)], device=self.device)
        self.dist.max_(flags)
        return bool(flags[0].item()), int(flags[1].item())

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    @property
    def tokens_per_s(self) -> float:
        return self.timed_tokens / self.train_s if self.train_s > 0 else 0.0

    def _optimizer_step(self) -> torch.Tensor:
        tc = self.config.train
        lr = self._scheduled_lr()
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(tc.grad_accum):
            x, y = self.sampler.next_batch()
            # DDP all-reduces gradients on the last micro-step only
            sync = not self.dist.active or micro == tc.grad_accum - 1
            with contextlib.nullcontext() if sync else self.eager.no_sync():
                with autocast(self.device, self.amp_dtype):
                    _, loss = self.forward(x, y)
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
        if tc.grad_clip:
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum

    def _scheduled_lr(self) -> float | None:
        """The lr for this step: warmup, then a decay over the budget; None leaves it to ReduceLROnPlateau."""
        tc = self.config.train
        if self.step < tc.warmup_steps:
            return tc.lr * (self.step + 1) / tc.warmup_steps
        if tc.lr_schedule == "plateau":
            return None
        done = max(self.step / tc.max_steps if tc.max_steps else 0.0,
                   (time.perf_counter() - self.run_start) / tc.max_seconds if tc.max_seconds else 0.0)
        done = min(done, 1.0)
        shape = 0.5 * (1 + math.cos(math.pi * done)) if tc.lr_schedule == "cosine" else 1.0 - done
        return tc.min_lr + (tc.lr - tc.min_lr) * shape

    def _evaluate(self, start: float) -> bool:
        """Score the fixed windows, log, checkpoint; True when early stopping should end the run."""
        t0 = time.perf_counter()
        tc = self.config.train
        val = self._windows_loss(self.corpus.val, self.val_starts)
        train = self._windows_loss(self.corpus.train, self.train_starts)
        if not (math.isfinite(val) and math.isfinite(train)):  # the last step left non-finite weights: save nothing
            raise WorkError(
                f"loss became {val} at step {self.step} (evaluation); training stopped without saving, the last "
                "checkpoints are untouched (try a lower train.lr or train.grad_clip)"
            )
        improved = val < self.best_val
        if improved:
            self.best_val, self.evals_since_best = val, 0
        else:
            self.evals_since_best += 1
        if self.step >= tc.warmup_steps and tc.lr_schedule == "plateau":
            self.plateau.step(val)
        step_loss = self.last_loss.item() if self.last_loss is not None else None
        record = {
            "step": self.step, "tokens": self.tokens, "step_loss": step_loss, "train_loss": train, "val_loss": val,
            "lr": self.lr,
            "tokens_per_s": self.tokens_per_s, "elapsed_s": self.elapsed_before + time.perf_counter() - start,
            "time": time.time(),
        }
        if self.dist.is_main:
            with open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self.config.train.tensorboard:
                self._tensorboard(record)
        if improved:
            self._save("best.pt")
        self._save("last.pt")
        self.eval_s += time.perf_counter() - t0
        self.reporter.evaluation(self.step, train, val, self.lr, self.tokens_per_s, record["elapsed_s"], improved)
        return bool(tc.early_stop_patience) and self.evals_since_best >= tc.early_stop_patience

    def _tensorboard(self, record: dict[str, Any]) -> None:
        if self.tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.out_dir / "tensorboard"))
        for key in ("train_loss", "val_loss", "lr", "tokens_per_s"):
            self.tb.add_scalar(key, record[key], self.step)
        self.tb.flush()

    def _windows_loss(self, ids: torch.Tensor, starts: torch.Tensor) -> float:
        """Mean loss on fixed windows; under DDP each rank scores its share and the sums are added up."""
        d = self.dist
        total, count = windows_total(self.model, ids, starts[d.rank :: d.world_size], self.config.model.block_size,
                                     self.device, amp_dtype=self.amp_dtype)
        both = d.sum_(torch.tensor([total, float(count)], dtype=torch.float64, device=self.device))
        return (both[0] / both[1]).item()

    def _save(self, name: str) -> None:
        state = self.state_dict()  # every rank takes part (it gathers per-rank states)
        if not self.dist.is_main:
            return
        try:
            if not self.config_written:  # with the first checkpoint, so that nothing is written before training
                atomic_write(self.out_dir / "config.yaml", lambda f: f.write(self.config.to_yaml().encode()))
                self.config_written = True
            save_checkpoint(self.out_dir / name, state)
        except OSError as e:
            raise WorkError(
                f"could not write checkpoint {self.out_dir / name}: {e.strerror or e}; the previous checkpoint is "
                "untouched (free some disk space, then `charlm train --resume`)"
            ) from e

    def _interrupt_message(self, signum: int) -> str:
        name = signal.Signals(signum).name
        return (
            f"{name} received: stopped at step {self.step} and saved {self.out_dir / 'last.pt'}; "
            f"continue with `charlm train --resume --out-dir {self.out_dir}`"
        )


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                   device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, norms); fused kernels where the device has them."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cuda", "cpu", "mps")
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


# ---------------------------------------------------------------------------- entry point


def run_training(config: Config, out_dir: Path, *, resume: bool = False, overwrite: bool = False,
                 resume_changes: dict[str, Any] | None = None, quiet: bool = False,
                 reporter: TrainReporter | None = None) -> TrainSummary | None:
    """Everything `charlm train` does: checks first, then data, model, loop, final full validation pass.

    Under torchrun every rank calls this; rank 0 alone writes files and returns the summary (others return None).
    """
    wall_start = time.perf_counter()
    stop = StopFlag()
    created = not out_dir.exists()

    def remove_if_ours_and_empty() -> None:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # interrupted before anything was written: leave no trace

    stop.cleanup = remove_if_ours_and_empty
    stop.install()
    dist = Dist()
    try:
        existing = check_out_dir(out_dir, resume, overwrite)
        ckpt = load_checkpoint(out_dir / "last.pt") if resume else None
        if ckpt:
            config = resume_config(ckpt.config, resume_changes or {})
        dist, device_name = setup(config.train.device)
        if not dist.is_main:
            reporter = TrainReporter(quiet=True, silent=True)
        summary = _run(config, ckpt, out_dir, existing if overwrite and not resume else [], device_name, dist,
                       reporter or TrainReporter(quiet), stop, wall_start)
        dist.barrier()  # leave together: a rank tearing down while rank 0 still evaluates can abort (gloo)
        return summary
    except Interrupted:
        remove_if_ours_and_empty()
        raise
    finally:
        stop.restore()
        teardown(dist)


def require_tensorboard() -> None:
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise UsageError('train.tensorboard needs the tensorboard package: pip install "charlm[tensorboard]"') from None


def _run(config: Config, ckpt: Checkpoint | None, out_dir: Path, replaced: list[str], device_name: str, dist: Dist,
         reporter: TrainReporter, stop: StopFlag, wall_start: float) -> TrainSummary | None:
    device = pick_device(device_name)
    autocast_dtype(device, config.train.dtype)  # refuse an impossible dtype before loading anything
    if config.train.tensorboard:
        require_tensorboard()
    corpus = Corpus.from_file(config.data.path, config.data.val_fraction, ckpt.tokenizer if ckpt else None)
    corpus.check_windows(config.model.block_size, config.data.path)
    dist.barrier()  # every rank has checked the run folder before rank 0 writes to it
    if dist.is_main:
        make_out_dir(out_dir, replaced)

    configure_backends(device)
    seed_everything(config.train.seed)  # identical initial weights on every rank
    model = ckpt.build_model(device) if ckpt else GPT(config.model, corpus.tokenizer.vocab_size).to(device)
    seed_everything(seed_for_rank(config.train.seed, dist.rank))  # then each rank its own dropout stream
    trainer = Trainer(config, model, corpus, device, out_dir, reporter, stop, dist)
    if ckpt:
        trainer.load_state_dict(ckpt)
        reporter.info(f"resuming {out_dir / 'last.pt'} at step {trainer.step}")
    if dist.active:
        reporter.info(f"DDP: {dist.world_size} processes, global batch {trainer.global_batch} windows "
                      f"({config.train.batch_size} per rank x {config.train.grad_accum} accumulation)")
    if should_compile(device, config.train.compile):
        trainer.forward = compile_or_warn(trainer.eager, reporter)

    reason = trainer.run()
    if not dist.is_main:
        return None
    best = load_checkpoint(out_dir / "best.pt").build_model(device)
    full = full_pass(best, corpus.val, config.model.block_size, device, amp_dtype=trainer.amp_dtype)
    return TrainSummary(
        best_val_loss=trainer.best_val, full_val_loss=full.loss, full_val_bpc=full.bpc, steps=trainer.step,
        tokens=trainer.tokens, wall_s=time.perf_counter() - wall_start, train_s=trainer.train_s,
        eval_s=trainer.eval_s, compile_s=trainer.compile_s, tokens_per_s=trainer.tokens_per_s,
        stop_reason=reason, params=model.num_params(), device=str(device), out_dir=str(out_dir),
        peak_memory_mb=peak_memory_mb(device), world_size=dist.world_size, global_batch=trainer.global_batch,
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


def compile_or_warn(model: nn.Module, reporter: TrainReporter) -> nn.Module:
    try:
        return torch.compile(model)
    except Exception as e:  # compile support varies by platform; eager always works
        reporter.warn(f"torch.compile unavailable ({type(e).__name__}: {e}); training without it")
        return model
