"""The training loop: AdamW, warmup then ReduceLROnPlateau (or a decay), periodic evaluation, checkpoints, limits.

The loop knows nothing about the model's internals: it calls model(x, y) -> (logits, loss) and model.parameters().
"""

from __future__ import annotations

import json
import math
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
from charlm.errors import CharlmError, UsageError, WorkError
from charlm.evaluate import full_pass, windows_loss
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


class Interrupted(CharlmError):
    """SIGINT or SIGTERM: a checkpoint was written (if training had started) and we exit 128 + signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- run folder


def prepare_out_dir(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a run by accident; make sure we can write there before any work starts."""
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
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / ".write-test", lambda f: f.write(b"ok"))
        (out_dir / ".write-test").unlink()
    except OSError as e:
        raise UsageError(f"cannot write to --out-dir {out_dir}: {e.strerror}; choose a writable folder") from None
    if overwrite and not resume:
        for name in existing:
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
    """Signal handlers only set this flag; the loop acts on it at the next step boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None
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

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class Trainer:
    def __init__(self, config: Config, model: GPT, corpus: Corpus, device: torch.device, out_dir: Path,
                 reporter: TrainReporter, stop: StopFlag):
        self.config, self.model, self.corpus, self.device = config, model, corpus, device
        self.out_dir, self.reporter, self.stop = out_dir, reporter, stop
        tc = config.train
        self.amp_dtype = autocast_dtype(device, tc.dtype)
        self.optimizer = make_optimizer(model, tc.lr, tc.weight_decay, (tc.beta1, tc.beta2), device)
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.optimizer, mode="min", factor=tc.plateau_factor, patience=tc.plateau_patience, min_lr=tc.min_lr
        )
        self.scaler = torch.amp.GradScaler(device.type) if self.amp_dtype == torch.float16 else None
        T = config.model.block_size
        self.sampler = BatchSampler(corpus.train, T, tc.batch_size, device, seed=tc.seed)
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
        self.run_start = time.perf_counter()  # reset when run() begins; time-based schedules count from it
        self.forward = model  # what the steps call: the model, or its compiled wrapper

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
            "rng": rng_state(),
            "sampler": self.sampler.state_dict(),
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
            set_rng_state(s["rng"])
            self.sampler.load_state_dict(s["sampler"])
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise UsageError(f"checkpoint {ckpt.path} lacks a usable training state ({e}); it cannot be resumed") from None
        tc = self.config.train  # schedule knobs may have been changed with --set on resume
        self.plateau.factor, self.plateau.patience = tc.plateau_factor, tc.plateau_patience
        self.plateau.min_lrs = [tc.min_lr] * len(self.optimizer.param_groups)

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> str:
        """Train until a limit, early stop or signal; evaluate at the end. Returns why it stopped."""
        tc = self.config.train
        first_step, last_eval = self.step, self.step
        per_step_tokens = tc.batch_size * tc.grad_accum * self.config.model.block_size
        start = self.run_start = time.perf_counter()
        self.reporter.start(self.step, tc.max_steps or None)
        reason = "max_steps"
        try:
            while True:
                if tc.max_steps and self.step >= tc.max_steps:
                    break
                if tc.max_seconds and time.perf_counter() - start >= tc.max_seconds:
                    reason = "max_seconds"
                    break
                if self.stop.signum is not None:
                    self._save("last.pt")
                    raise Interrupted(self._interrupt_message(), self.stop.signum)
                t0 = time.perf_counter()
                loss = self._first_step() if self.step == first_step else self._optimizer_step()
                dt = time.perf_counter() - t0
                self.step += 1
                self.tokens += per_step_tokens
                if self.step == first_step + 1 and self.forward is not self.model:
                    self.compile_s = dt  # the first compiled step includes compilation: report it apart
                else:
                    self.train_s += dt
                    self.timed_tokens += per_step_tokens
                if self.reporter.bar is not None and (self.step % 10 == 0 or self.step == first_step + 1):
                    self.reporter.step(self.step, loss.item(), self.lr, self.tokens_per_s)
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
        if self.forward is self.model:
            return self._optimizer_step()
        try:
            return self._optimizer_step()
        except CharlmError:
            raise
        except Exception as e:  # compiler errors come in many types (BackendCompilerFailed, InductorError, ...)
            self.reporter.warn(f"torch.compile failed ({type(e).__name__}); training without it")
            self.forward = self.model
            self.optimizer.zero_grad(set_to_none=True)
            return self._optimizer_step()

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
        for _ in range(tc.grad_accum):
            x, y = self.sampler.next_batch()
            with autocast(self.device, self.amp_dtype):
                _, loss = self.forward(x, y)
            loss = loss / tc.grad_accum
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        if not torch.isfinite(loss_sum):  # stop before the optimizer step, so no weight is touched
            raise WorkError(
                f"loss became {loss_sum.item() * tc.grad_accum} at step {self.step + 1}; training stopped before "
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
        tc, T = self.config.train, self.config.model.block_size
        val = windows_loss(self.model, self.corpus.val, self.val_starts, T, self.device, amp_dtype=self.amp_dtype)
        train = windows_loss(self.model, self.corpus.train, self.train_starts, T, self.device, amp_dtype=self.amp_dtype)
        improved = val < self.best_val
        if improved:
            self.best_val, self.evals_since_best = val, 0
        else:
            self.evals_since_best += 1
        if self.step >= tc.warmup_steps and tc.lr_schedule == "plateau":
            self.plateau.step(val)
        record = {
            "step": self.step, "tokens": self.tokens, "train_loss": train, "val_loss": val, "lr": self.lr,
            "tokens_per_s": self.tokens_per_s, "elapsed_s": self.elapsed_before + time.perf_counter() - start,
            "time": time.time(),
        }
        with open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if improved:
            self._save("best.pt")
        self._save("last.pt")
        self.eval_s += time.perf_counter() - t0
        self.reporter.evaluation(self.step, train, val, self.lr, self.tokens_per_s, record["elapsed_s"], improved)
        return bool(tc.early_stop_patience) and self.evals_since_best >= tc.early_stop_patience

    def _save(self, name: str) -> None:
        try:
            save_checkpoint(self.out_dir / name, self.state_dict())
        except OSError as e:
            raise WorkError(
                f"could not write checkpoint {self.out_dir / name}: {e.strerror or e}; the previous checkpoint is "
                "untouched (free some disk space, then `charlm train --resume`)"
            ) from e

    def _interrupt_message(self) -> str:
        name = signal.Signals(self.stop.signum).name
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
                 reporter: TrainReporter | None = None) -> TrainSummary:
    """Everything `charlm train` does: checks first, then data, model, loop, final full validation pass."""
    wall_start = time.perf_counter()
    stop = StopFlag()
    stop.install()
    try:
        return _run(config, out_dir, resume, overwrite, resume_changes or {}, reporter or TrainReporter(quiet),
                    stop, wall_start)
    finally:
        stop.restore()


def _run(config, out_dir, resume, overwrite, resume_changes, reporter, stop, wall_start) -> TrainSummary:
    prepare_out_dir(out_dir, resume, overwrite)
    ckpt = None
    if resume:
        ckpt = load_checkpoint(out_dir / "last.pt")
        config = resume_config(ckpt.config, resume_changes)
    device = pick_device(config.train.device)
    autocast_dtype(device, config.train.dtype)  # refuse an impossible dtype before loading anything
    corpus = Corpus.from_file(config.data.path, config.data.val_fraction, ckpt.tokenizer if ckpt else None)
    corpus.check_windows(config.model.block_size, config.data.path)
    _exit_if_signalled(stop)

    configure_backends(device)
    seed_everything(config.train.seed)
    model = ckpt.build_model(device) if ckpt else GPT(config.model, corpus.tokenizer.vocab_size).to(device)
    trainer = Trainer(config, model, corpus, device, out_dir, reporter, stop)
    if ckpt:
        trainer.load_state_dict(ckpt)
        reporter.info(f"resuming {out_dir / 'last.pt'} at step {trainer.step}")
    (out_dir / "config.yaml").write_text(config.to_yaml(), encoding="utf-8")
    if should_compile(device, config.train.compile):
        trainer.forward = compile_or_warn(model, reporter)
    _exit_if_signalled(stop)

    reason = trainer.run()
    trainer.forward = model
    best = load_checkpoint(out_dir / "best.pt").build_model(device)
    full = full_pass(best, corpus.val, config.model.block_size, device, amp_dtype=trainer.amp_dtype)
    return TrainSummary(
        best_val_loss=trainer.best_val, full_val_loss=full.loss, full_val_bpc=full.bpc, steps=trainer.step,
        tokens=trainer.tokens, wall_s=time.perf_counter() - wall_start, train_s=trainer.train_s,
        eval_s=trainer.eval_s, compile_s=trainer.compile_s, tokens_per_s=trainer.tokens_per_s,
        stop_reason=reason, params=model.num_params(), device=str(device), out_dir=str(out_dir),
        peak_memory_mb=peak_memory_mb(device),
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


def _exit_if_signalled(stop: StopFlag) -> None:
    """A signal before the first step: nothing worth saving yet, so leave at once."""
    if stop.signum is not None:
        raise Interrupted(f"{signal.Signals(stop.signum).name} received before training started; nothing was written",
                          stop.signum)


def compile_or_warn(model: nn.Module, reporter: TrainReporter) -> nn.Module:
    try:
        return torch.compile(model)
    except Exception as e:  # compile support varies by platform; eager always works
        reporter.warn(f"torch.compile unavailable ({type(e).__name__}: {e}); training without it")
        return model
