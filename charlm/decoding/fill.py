"""Filling blanks with an encoder (`charlm fill`): every hidden character predicted at once from the rest."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from charlm.models.encoder import Encoder


@dataclass
class Blank:
    """One blank of a filled text: where it is, and what could stand there."""

    position: int
    candidates: list[tuple[str, float]]  # the most likely characters and their probabilities


@torch.no_grad()
def predict_blanks(model: Encoder, ids: list[int], blanks: list[int], top: int) -> list[list[tuple[int, float]]]:
    """Every blank's top candidates (id, probability), all blanks predicted at once from one forward pass."""
    model.eval()
    device = next(model.parameters()).device
    inputs = torch.tensor([ids], device=device)
    inputs[0, blanks] = model.mask_id
    logits = model(inputs)[0][0, blanks, : model.vocab_size].float()  # (blanks, V): never the mask symbol
    probs = torch.softmax(logits, dim=-1)
    values, indices = probs.topk(min(top, model.vocab_size), dim=-1)
    return [list(zip(i.tolist(), v.tolist(), strict=True)) for v, i in zip(values, indices, strict=True)]
