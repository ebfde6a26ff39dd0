"""Scoring a model on token ids: deterministic full passes and the cheap fixed-window estimate used while training.

Pure scoring: reading files and checkpoints is the caller's business (charlm.api.model, charlm.training.run).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from charlm.data.corpus import IGNORE, full_pass_windows, strided_windows, windows_at
from charlm.data.prepare import release_mapped_pages
from charlm.hardware.device import autocast


class InNats:
    """What every score derives from its mean loss in nats: bits per character and perplexity."""

    loss: float

    @property
    def bpc(self) -> float:
        return self.loss / math.log(2)

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)


@dataclass
class EvalResult(InNats):
    loss: float  # mean cross-entropy in nats per token (character or byte)
    chars: int  # tokens scored (characters, or bytes for a byte model)
    split: str = "all"  # which part of the file: train, val, test or all
    file: str = ""  # the text file scored
    stride: int = 0  # windows' stride (block_size: non-overlapping windows)
    unit: str = "char"  # what a token is: char or byte (so bits per character or bits per byte)

    def to_dict(self) -> dict:
        return {**asdict(self), "bpc": self.bpc, "perplexity": self.perplexity}


@torch.no_grad()
def summed_loss(model: nn.Module, batches, device: torch.device, amp_dtype: torch.dtype | None) -> tuple[float, int]:
    """Summed cross-entropy (nats) over every scored target of `batches`, (inputs, targets) with inputs one tensor or
    a tuple of them and targets IGNORE where nothing is scored, and how many there were."""
    total = torch.zeros((), dtype=torch.float64, device=device)  # accumulate on device: one sync at the end
    count = 0
    for i, (x, y) in enumerate(batches):
        if i % 16 == 0:
            release_mapped_pages()  # a pass over a big split must not keep all it read resident
        inputs, y = tuple(t.to(device) for t in (x if isinstance(x, tuple) else (x,))), y.to(device)
        with autocast(device, amp_dtype):
            _, loss = model(*inputs, y)
        scored = int((y != IGNORE).sum())
        total += loss.double() * scored
        count += scored
    return total.item(), count


def full_pass(
    model: nn.Module,
    ids: torch.Tensor,
    block_size: int,
    device: torch.device,
    batch_size: int = 64,
    amp_dtype: torch.dtype | None = None,
    stride: int | None = None,
) -> EvalResult:
    """Every character after the first scored once: in non-overlapping windows of the model's context (stride None
    or block_size), or in windows `stride` apart giving each at least block_size - stride characters of context."""
    stride = block_size if stride is None else stride
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride must be in 1..{block_size}, got {stride}")
    windows = (
        full_pass_windows(ids, block_size, batch_size)
        if stride == block_size
        else strided_windows(ids, block_size, stride, batch_size)
    )
    was_training = model.training
    model.eval()
    total, count = summed_loss(model, windows, device, amp_dtype)
    model.train(was_training)
    return EvalResult(total / max(count, 1), count, stride=stride)


def windows_total(
    model: nn.Module,
    ids: torch.Tensor,
    starts: torch.Tensor,
    block_size: int,
    device: torch.device,
    batch_size: int = 64,
    amp_dtype: torch.dtype | None = None,
) -> tuple[float, int]:
    """Summed loss and target count over fixed windows (the low-noise periodic estimate)."""
    offsets = torch.arange(block_size + 1)
    batches = (windows_at(ids, starts[i : i + batch_size], offsets, device) for i in range(0, len(starts), batch_size))
    was_training = model.training
    model.eval()
    total, count = summed_loss(model, batches, device, amp_dtype)
    model.train(was_training)
    return total, count


def surprisal(model: nn.Module, ids: list[int], block: int) -> list[float]:
    """-ln p(token | up to `block` tokens before it) for every token after the first (nats), for the score view.

    Windows overlap by half, and each token is scored in the window that gives it the most context.
    """
    stride = max(1, block // 2)
    x = torch.tensor(ids, device=next(model.parameters()).device)
    out = torch.empty(len(ids) - 1)
    start = 0
    while True:
        window = x[start : start + block + 1]  # inputs window[:-1] predict window[1:]
        logits = model(window[None, :-1])[0][0].float()  # (T, V)
        nats = F.cross_entropy(logits, window[1:], reduction="none").cpu()  # (T,)
        first_new = 0 if start == 0 else block - stride  # earlier targets were scored with more context
        out[start + first_new : start + len(nats)] = nats[first_new:]
        if start + block + 1 >= len(ids):
            return out.tolist()
        start += stride
