"""An exponential moving average of the weights (train.ema_decay): what evaluations score and best.pt keeps.

Why: late in a run each step moves the weights by its batch's noise; the average over the last ~1/(1 - decay)
steps sits nearer the minimum those steps circle (Polyak & Juditsky 1992), as translation and G2P toolkits average
their last checkpoints. The average is updated after every optimizer step, identically on every rank (the weights
are), and saved whole in last.pt beside the training weights, so that --resume continues it exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class WeightAverage:
    """The moving average of a model's floating-point parameters, and a way to put it in the model for a while."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        # named_parameters() lists a tied weight (embedding and head) once: it is averaged once
        self.named = [(name, p) for name, p in model.named_parameters() if p.is_floating_point()]
        self.average = [p.detach().clone() for _, p in self.named]
        self.updates = 0

    def update(self) -> None:
        """Fold the weights of the step just taken in. The first steps count more (decay (1 + n) / (10 + n) until
        it reaches `decay`), so the average soon forgets the initial weights."""
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            torch._foreach_lerp_(self.average, [p.detach() for _, p in self.named], 1.0 - decay)

    @contextlib.contextmanager
    def in_model(self) -> Iterator[None]:
        """Inside, the model's parameters hold the average (copied in place: the same tensors, so an optimizer, DDP
        or a compiled graph that holds them is undisturbed); the training weights come back on the way out, however
        it is left."""
        params: list[torch.Tensor] = [p for _, p in self.named]
        with torch.no_grad():
            training = [p.detach().clone() for p in params]
        try:
            with torch.no_grad():
                torch._foreach_copy_(params, self.average)
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(params, training)

    def state_dict(self) -> dict[str, Any]:
        """The average as it is (torch.save copies it at once: no clone)."""
        return {
            "updates": self.updates,
            "weights": {name: t for (name, _), t in zip(self.named, self.average, strict=True)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refuses (ValueError, one line) an average that is not this model's, or not finite."""
        weights = state["weights"]
        if set(weights) != {name for name, _ in self.named}:
            raise ValueError("its weight average does not match the model's parameters")
        for (name, _), mine in zip(self.named, self.average, strict=True):
            given = weights[name]
            if not torch.is_tensor(given) or given.shape != mine.shape or not torch.isfinite(given).all():
                raise ValueError(f"its weight average of {name} is not a finite tensor of shape {tuple(mine.shape)}")
        with torch.no_grad():
            for (name, _), mine in zip(self.named, self.average, strict=True):
                mine.copy_(weights[name])
        self.updates = int(state["updates"])
