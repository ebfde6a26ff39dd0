"""Choosing the next character: a pure function of logits, the options and a seeded torch.Generator."""

from __future__ import annotations

import torch


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row (k above the vocabulary size keeps all)."""
    if k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus: keep the smallest set of characters whose probability reaches p, always the most likely one."""
    if p >= 1.0:
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
    """Next ids (B,) from logits (B, V): temperature, then top-k, then top-p, then a draw. Temperature 0 is argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / max(temperature, 1e-6)  # a tinier one would overflow to inf: greedy by then anyway
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    logits = filter_top_p(logits, top_p)
    return draw(torch.softmax(logits, dim=-1), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One id per row (B,) drawn from probs (B, V): torch.multinomial(probs, 1)'s own algorithm (argmax of p / q,
    q ~ Exp(1)), the same draws from the same generator, without its checks of the probabilities, which cost a
    batch-1 decoding step ~25 µs and two host round trips; probs here always come from a softmax."""
    q = torch.empty_like(probs).exponential_(1.0, generator=generator)  # (B, V)
    return (probs / q).argmax(dim=-1)


def sample_rows(
    logits: torch.Tensor,
    generators: list[torch.Generator],
    temperatures: list[float],
    top_ks: list[int | None],
    top_ps: list[float],
) -> list[int]:
    """Next ids of rows that each have their own options and generator (`charlm serve`'s running batch).

    One batched pass over logits (B, V) instead of one sample_next per row; each row spends exactly one uniform draw
    of its own generator, so its text depends on its seed alone. Top-k keeps exactly k characters (ties broken by
    order); temperature 0 is argmax, as in sample_next.
    """
    V = logits.size(-1)
    logits = logits.float()
    temperature = torch.tensor(temperatures, device=logits.device)[:, None]  # (B, 1)
    scaled = logits / temperature.clamp(min=1e-6)
    ordered, order = torch.sort(scaled, dim=-1, descending=True)  # (B, V) each
    rank = torch.arange(V, device=logits.device)  # (V,)
    k = torch.tensor([V if top_k is None else top_k for top_k in top_ks], device=logits.device)[:, None]  # (B, 1)
    ordered = ordered.masked_fill(rank >= k, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # probability mass ranked above each character
    drop = before >= torch.tensor(top_ps, device=logits.device)[:, None]
    drop[:, 0] = False
    probs = probs.masked_fill(drop, 0.0)
    cdf = torch.cumsum(probs, dim=-1)  # (B, V)
    draws = torch.cat([torch.rand(1, generator=g, device=logits.device) for g in generators])  # (B,)
    chosen = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True).clamp(max=V - 1)  # (B, 1)
    ids = order.gather(-1, chosen).squeeze(-1)  # (B,)
    ids = torch.where(temperature[:, 0] == 0, logits.argmax(dim=-1), ids)
    return ids.tolist()
