"""A training run's loop state in one object: what every checkpoint saves whole, and what its summary is built from."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from charlm.evaluation.loss import EvalResult


@dataclass
class RunState:
    """The loop's counters. A checkpoint stores them all (beside the optimizer's, schedule's and random streams'
    own states); a resume restores the first group and starts this invocation's at zero."""

    step: int = 0
    tokens: int = 0  # training tokens seen, over all invocations (target characters, for pairs)
    best_val_loss: float = math.inf  # best periodic validation estimate (nats/token)
    evals_since_best: int = 0
    best_val_accuracy: float = -1.0  # train.best_by accuracy: the best periodic validation accuracy (-1: none yet)
    elapsed_s: float = 0.0  # wall seconds in the training loop (compilation included), over all invocations
    lr: float = 0.0  # the learning rate of the last step (0: not recorded, in checkpoints older than this field)
    world_size: int = 1  # processes (torchrun ranks)
    global_batch: int = 0  # windows per optimizer step: batch_size x grad_accum x world_size
    data_bytes: int = 0  # the size of data.path's files when the run last started (0: not recorded)
    # This invocation's, zero again after a resume:
    train_s: float = 0.0  # seconds in training steps (compilation and evaluation excluded)
    eval_s: float = 0.0
    compile_s: float = 0.0  # the first compiled step, compilation included
    timed_tokens: int = 0  # tokens of the steps counted in train_s

    @property
    def tokens_per_s(self) -> float:
        return self.timed_tokens / self.train_s if self.train_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, stored: dict[str, Any]) -> RunState:
        """A saved state continued: this invocation's counters at zero; a field that older checkpoints lack (tokens,
        evals_since_best, elapsed_s, lr, data_bytes) keeps its default."""
        kept = {f.name for f in fields(cls)} - set(INVOCATION_FIELDS)
        defaults = cls()  # each stored value read as its field's type (a checkpoint may hold 0 for 0.0)
        return cls(**{name: type(getattr(defaults, name))(stored[name]) for name in kept if name in stored})


INVOCATION_FIELDS = ("train_s", "eval_s", "compile_s", "timed_tokens")


@dataclass
class TrainSummary:
    """What `charlm train --json` prints and summary.json holds: the run's state and its final validation pass."""

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
    precision: str  # float32, or the autocast dtype (bfloat16, float16) of training and evaluation
    linear_kernels: str  # onednn or torch: whose float32 kernels ran the linear layers (train.cpu_linear)
    # pairs: per given validation or test file, its characters the training file lacks, read as the unknown symbol
    # (chars), the lines that held one (lines), those whose target did (target_lines), and its features the training
    # file lacks (features: with a features column)
    unseen_chars: dict[str, dict[str, int]] = field(default_factory=dict)
    best_val_accuracy: float | None = None  # train.best_by accuracy: what chose best.pt (None: the loss did)

    @classmethod
    def of(
        cls, state: RunState, stop_reason: str, full: EvalResult, whole: bool, unit: str, **run: Any
    ) -> TrainSummary:
        """The summary of a finished run: its state, why it stopped, the final pass, and `run`'s wall_s, params,
        device, out_dir, peak_memory_mb, precision and linear_kernels."""
        return cls(
            best_val_loss=state.best_val_loss,
            best_val_accuracy=state.best_val_accuracy if state.best_val_accuracy >= 0 else None,
            full_val_loss=full.loss,
            full_val_bpc=full.bpc,
            full_val_tokens=full.chars,
            full_val_whole=whole,
            unit=unit,
            steps=state.step,
            tokens=state.tokens,
            train_s=state.train_s,
            eval_s=state.eval_s,
            compile_s=state.compile_s,
            tokens_per_s=state.tokens_per_s,
            stop_reason=stop_reason,
            world_size=state.world_size,
            global_batch=state.global_batch,
            **run,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
