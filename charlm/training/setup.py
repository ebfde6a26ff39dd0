"""What a Trainer is built from: how a caller asks it to stop, its autocast dtype, a compiled forward that falls back
to eager, each rank's seed, and the peak memory its summary reports."""

from __future__ import annotations

import sys
from typing import Protocol, cast

import torch
from torch import nn

from charlm.config.schema import Config
from charlm.hardware.device import autocast_dtype
from charlm.models.linear import use_onednn
from charlm.progress import TrainReporter


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


def training_dtype(config: Config, device: torch.device) -> torch.dtype | None:
    """The run's autocast dtype (None: float32), from train.dtype, the device, and the size of a micro-batch."""
    tokens = config.train.batch_size * config.model.block_size
    onednn = use_onednn(device, config.train.cpu_linear)  # float32's kernels: what bf16 must beat
    return autocast_dtype(device, config.train.dtype, config.model.n_embd, tokens, onednn)


def seed_for_rank(seed: int, rank: int) -> int:
    """Each rank's own batch and dropout streams; rank 0's is the single-process one."""
    return seed + 1_000_003 * rank


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource  # POSIX only
    except ImportError:
        return 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux
