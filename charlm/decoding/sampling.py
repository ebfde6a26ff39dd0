"""Choosing the next character: a pure function of logits, the options and a seeded torch.Generator.

Generators are the CPU's on every device (torch.Generator()): the draws a seed makes are the same numbers on a CPU,
on a GPU and through an ONNX export in charlm, so a seed's text differs between devices only where their logits round
differently. (The web page draws from its own generator: torch's cannot be reproduced in JavaScript.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def seeded_generator(seed: int | None) -> torch.Generator:
    """The generator a decoding draws from: the CPU's, seeded with `seed` (a fresh seed without one)."""
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else torch.seed())
    return generator


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row (k above the vocabulary size keeps all)."""
    if k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float | torch.Tensor) -> torch.Tensor:
    """Nucleus: keep the smallest set of characters whose probability reaches p, always the most likely one (p: one
    for all rows, or (B, 1), inf where a row keeps everything)."""
    if not isinstance(p, torch.Tensor) and p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # probability mass ranked above each character
    drop_sorted = before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_next(
    logits: torch.Tensor,
    generator: torch.Generator | None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Next ids (B,) from logits (B, V) with one set of options and one generator for every row (see sample_rows)."""
    return _one_set(logits, [generator] * logits.size(0), temperature, top_k, top_p)


def _one_set(
    logits: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    temperature: float,
    top_k: int | None,
    top_p: float,
) -> torch.Tensor:
    """The rule below with one set of options for every row: (B,) ids."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / max(temperature, 1e-6)  # a tinier one would overflow to inf: greedy by then anyway
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    return draw(torch.softmax(filter_top_p(logits, top_p), dim=-1), generators)


def sample_rows(
    logits: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    temperatures: list[float],
    top_ks: list[int | None],
    top_ps: list[float],
) -> list[int]:
    """Next ids of rows that each have their own options and generator (`charlm serve`'s running batch).

    The same rule as sample_next, row by row: temperature, then top-k (ties with the k-th kept), then top-p, then the
    draw; temperature 0 is argmax. A row's id depends on its logits, its options and its generator alone, so a seed
    gives the text `charlm sample` gives, whatever else is running.
    """
    if len(set(temperatures)) == 1 and len(set(top_ks)) == 1 and len(set(top_ps)) == 1:  # one set of options
        return _one_set(logits, generators, temperatures[0], top_ks[0], top_ps[0]).tolist()
    V, device = logits.size(-1), logits.device
    temperature = torch.tensor(temperatures, device=device)[:, None]  # (B, 1)
    scaled = logits.float() / temperature.clamp(min=1e-6)
    k = torch.tensor([V if top_k is None else min(top_k, V) for top_k in top_ks], device=device)[:, None]  # (B, 1)
    kth = torch.sort(scaled, dim=-1, descending=True).values.gather(-1, k - 1)  # (B, 1)
    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    p = torch.tensor([math.inf if top_p >= 1.0 else top_p for top_p in top_ps], device=device)[:, None]  # (B, 1)
    scaled = filter_top_p(scaled, p)
    ids = draw(torch.softmax(scaled, dim=-1), generators)
    return torch.where(temperature[:, 0] == 0, logits.argmax(dim=-1), ids).tolist()


def draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One id per row (B,) drawn from probs (B, V), row i with generators[i].

    torch.multinomial(probs, 1)'s own algorithm (argmax of p / q, q ~ Exp(1)), the same draws from the same generator,
    without its checks of the probabilities (each a host round trip); probs here always come from a softmax. Rows that
    share a generator take their draws from it together, in row order, exactly as one (B, V) draw would.
    """
    # (B, V) on the CPU whatever the model's device (and torch's default device and dtype): a seed draws the same q
    q = torch.empty(probs.shape, dtype=torch.float32, device="cpu")
    rows_of: dict[int, list[int]] = {}
    for row, generator in enumerate(generators):
        rows_of.setdefault(id(generator), []).append(row)
    if len(rows_of) == 1:
        q.exponential_(1.0, generator=generators[0])
    else:
        for rows in rows_of.values():
            q[torch.tensor(rows, device="cpu")] = torch.empty(len(rows), probs.size(-1), device="cpu").exponential_(
                1.0, generator=generators[rows[0]]
            )
    return (probs / q.to(probs.device)).argmax(dim=-1)
