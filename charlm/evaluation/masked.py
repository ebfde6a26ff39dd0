"""Scoring an encoder (model.arch: encoder): how well it restores hidden characters, each window hidden alike on
every call and on every rank, so the score is a low-noise signal."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from charlm.data.corpus import IGNORE
from charlm.data.masking import hide
from charlm.evaluation.loss import InNats
from charlm.hardware.device import autocast
from charlm.models.encoder import Encoder

EVAL_SEED = 0  # evaluations hide the same positions every time: a low-noise signal, as fixed windows are


@dataclass
class MaskedResult(InNats):
    """`charlm eval` for an encoder: how well it restores hidden characters."""

    loss: float  # nats per hidden character
    accuracy: float  # fraction of hidden characters restored exactly (the top candidate)
    chars: int  # hidden characters scored
    split: str = "val"
    file: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "bpc": self.bpc}


@torch.no_grad()
def masked_score(
    model: Encoder,
    ids: torch.Tensor,
    starts: torch.Tensor,
    device: torch.device,
    batch_size: int = 64,
    amp_dtype: torch.dtype | None = None,
) -> tuple[float, int, int]:
    """Summed loss, characters restored and characters hidden over windows at `starts`. Each window is hidden by a
    generator seeded from EVAL_SEED and its own start, so a window looks the same whichever batch or rank scores it."""
    generator = torch.Generator()
    offsets = torch.arange(model.config.block_size)
    was_training = model.training
    model.eval()
    total, right, count = 0.0, 0, 0
    for i in range(0, len(starts), batch_size):
        hidden_windows = []
        for start in starts[i : i + batch_size].tolist():
            generator.manual_seed(EVAL_SEED * 1_000_003 + start)
            hidden_windows.append(hide(ids[start + offsets].long()[None], model.vocab_size, generator))
        inputs = torch.cat([w[0] for w in hidden_windows])
        targets = torch.cat([w[1] for w in hidden_windows])
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast(device, amp_dtype):
            logits, loss = model(inputs, targets)
        hidden = targets != IGNORE
        n = int(hidden.sum())
        total += float(loss) * n
        right += int((logits[..., : model.vocab_size].argmax(-1) == targets)[hidden].sum())
        count += n
    model.train(was_training)
    return total, right, count


def all_windows(ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Starts of the non-overlapping whole windows of a split (what `charlm eval` scores)."""
    return torch.arange(0, len(ids) - block_size + 1, block_size)
