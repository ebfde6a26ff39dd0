"""Scoring whole items (data.format: lines): each item's log-likelihood from its start symbol to its end symbol, and
the loss per character with the end symbol counted as one (makemore's measure).

Pure scoring on ids: reading files and checkpoints is the caller's business (charlm.families.lines).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from charlm.data.corpus import IGNORE
from charlm.data.lines import Item, frame, in_length_order
from charlm.evaluation.loss import InNats
from charlm.hardware.device import autocast


@dataclass
class ItemScore:
    item: str
    logprob: float  # ln p(item, then the end symbol | the start symbol), in nats
    chars: int  # the item's characters plus its end symbol: the predictions scored

    @property
    def per_char(self) -> float:
        """Nats per character, the end symbol counted as one."""
        return -self.logprob / self.chars


@dataclass
class ItemsResult(InNats):
    loss: float  # mean cross-entropy in nats per character, each item's end symbol counted as a character
    chars: int  # characters scored, end symbols included
    items: int
    split: str = "all"
    file: str = ""
    unit: str = "char"
    scores: list[ItemScore] = field(default_factory=list)  # per item, in the file's order (charlm score)
    skipped: list[str] = field(default_factory=list)  # lines left out as data.skip_bad_lines says, in words

    @property
    def mean_logprob(self) -> float:
        """Mean log-likelihood of an item, in nats (the whole item and its end symbol)."""
        return -self.loss * self.chars / max(self.items, 1)

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "scores"}
        out |= {"bpc": self.bpc, "perplexity": self.perplexity, "mean_logprob": self.mean_logprob}
        if self.scores:
            out["scores"] = [{**asdict(s), "per_char": s.per_char} for s in self.scores]
        return out


@torch.no_grad()
def item_logprobs(
    model: nn.Module,
    items: list[Item],
    device: torch.device,
    batch_size: int = 256,
    amp_dtype: torch.dtype | None = None,
) -> list[float]:
    """ln p of each item and its end symbol given the start symbol (nats), in the order given. Items are batched by
    length; each row is one item, so an item's figure does not depend on what it is batched with."""
    was_training = model.training
    model.eval()
    out = [0.0] * len(items)
    for indices in in_length_order(items, batch_size):
        x, y = frame([items[i] for i in indices], device)
        with autocast(device, amp_dtype):
            logits = model(x)[0]  # (B, T, V)
        nats = F.cross_entropy(logits.float().transpose(1, 2), y, ignore_index=IGNORE, reduction="none")  # (B, T)
        for i, total in zip(indices, nats.double().sum(dim=1).tolist(), strict=True):
            out[i] = -total
    model.train(was_training)
    return out


def items_total(
    model: nn.Module,
    items: list[Item],
    device: torch.device,
    batch_size: int = 256,
    amp_dtype: torch.dtype | None = None,
) -> tuple[float, int]:
    """Summed cross-entropy (nats) over every character and end symbol of the items, and how many there were."""
    logprobs = item_logprobs(model, items, device, batch_size, amp_dtype)
    return -math.fsum(logprobs), sum(len(item) + 1 for item in items)


def score_items(
    model: nn.Module, items: list[Item], texts: list[str], device: torch.device, batch_size: int = 256
) -> ItemsResult:
    """Every item's log-likelihood and the loss per character over all of them (the end symbols counted)."""
    logprobs = item_logprobs(model, items, device, batch_size)
    scores = [ItemScore(t, lp, len(item) + 1) for t, lp, item in zip(texts, logprobs, items, strict=True)]
    chars = sum(s.chars for s in scores)
    return ItemsResult(-math.fsum(logprobs) / max(chars, 1), chars, len(items), scores=scores)
