"""Multi-head attention for every family: causal, both ways and across, every positional encoding through one mask.

RoPE rotates queries and keys here; ALiBi is an additive bias by distance, built by attention_mask with the causal
window or the padding; the absolute encodings (learned, sinusoidal) were added to the embeddings and act through
the content. Scores go through torch's fused kernel, or are written out (explicit_attention) when model.attention is
explicit or when the weights are recorded (recorded_attention).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.models.kvcache import Cache
from charlm.models.layers import Dropout, ResidualProjection, Rotary, TokenShift, alibi_slopes, part_bias
from charlm.models.linear import Linear

Kind = Literal["causal", "both", "cross"]
Memory = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # cross-attention's keys, values (B, nh, S, hd), mask (B, S)


def heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) -> (B, nh, T, hd)."""
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)


def padding_mask(key_mask: torch.Tensor) -> torch.Tensor:
    """(B, S), True for real characters -> (B, 1, 1, S): every query may attend to every key but padding."""
    return key_mask[:, None, None, :]


def attention_mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int,
    slopes: torch.Tensor | None,
    dtype: torch.dtype,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Where each query may attend: a boolean mask, or with ALiBi an additive bias.

    Causal (no key_mask): each query sees itself and the window - 1 positions before it, never the future: (Tq, Tk),
    or (B, 1, Tq, Tk) for positions given per row, (B, Tq) and (B, Tk). Both ways (key_mask (B, Tk), True for real
    characters): every key but padding, (B, 1, 1, Tk). With ALiBi: -slope x distance (|distance| both ways), -inf
    where not allowed, with a head axis: (nh, Tq, Tk) or (B, nh, Tq, Tk).
    """
    if key_mask is None:
        distance = q_pos[..., :, None] - k_pos[..., None, :]  # (Tq, Tk) or (B, Tq, Tk)
        allowed = (distance >= 0) & (distance < window)
        if slopes is None:
            return allowed if allowed.dim() == 2 else allowed[:, None]
        allowed = allowed.unsqueeze(-3)  # a head axis: (1, Tq, Tk) or (B, 1, Tq, Tk)
    else:
        allowed = padding_mask(key_mask)  # (B, 1, 1, Tk)
        if slopes is None:
            return allowed
        distance = (q_pos[:, None] - k_pos[None, :]).abs()  # (Tq, Tk)
    bias = -slopes.to(dtype)[:, None, None] * distance.unsqueeze(-3).to(dtype)  # (nh, Tq, Tk) or (B, nh, Tq, Tk)
    return bias.masked_fill(~allowed, float("-inf"))


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q Kᵀ / √d_head + M) V, one step per line.

    Returns the output (B, nh, T, hd) and the weights (B, nh, T, S).

    mask: True where a query may attend, or an additive bias with -inf where it may not (ALiBi): attention_mask's.
    """
    scale = q.size(-1) ** -0.5  # 1 / √d_head
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, hd) @ (B, nh, hd, S) -> (B, nh, T, S)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))  # the future, beyond the window, padding: no weight
    else:
        scores = scores + mask  # ALiBi: -slope x distance, -inf where not allowed
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, nh, T, S), each row sums to 1
    return dropout(weights) @ v, weights  # (B, nh, T, S) @ (B, nh, S, hd) -> (B, nh, T, hd)


class Attention(nn.Module):
    """Multi-head attention of one kind:

    - causal: each position attends to itself and the block_size - 1 before it (a decoder's self-attention); Q, K
      and V from one projection, the keys and values kept in a cache while decoding, and token shift at its input;
    - both: every position attends to every other but padding (an encoder's self-attention);
    - cross: queries from a decoder, keys and values from the encoder's output (`read`); no positional term, as a
      source position and a target position are not on one axis: the alignment is learned from content.

    Set `keep_weights` to record the attention weights of the next forward pass in `weights` (explicit path).
    """

    slopes: torch.Tensor | None  # ALiBi's per-head slopes (a buffer), or None

    def __init__(self, config: ModelConfig, kind: Kind):
        super().__init__()
        C, self.n_head, self.causal = config.n_embd, config.n_head, kind == "causal"
        self.window = config.block_size  # causal: each position sees itself and block_size - 1 before it
        self.explicit = config.attention == "explicit"
        self.keep_weights = False
        self.weights: torch.Tensor | None = None  # (B, nh, T, S) of the last forward, when keep_weights
        if self.causal:  # the names checkpoints hold: qkv fused, or q and kv apart (cross: kv from another input)
            self.qkv = Linear(C, 3 * C, bias=part_bias(config, "qkv"))
        else:
            self.q = Linear(C, C, bias=part_bias(config, "qkv"))
            self.kv = Linear(C, 2 * C, bias=part_bias(config, "qkv"))
        self.proj = ResidualProjection(C, C, bias=part_bias(config, "proj"))
        # Dropout of the attention weights: SDPA's fused CPU kernel has none, so any sends it to the unfused fallback
        # (slower, with a mask as large as the scores); model.attention_dropout: 0 keeps dropout to the residual stream.
        self.dropout = config.dropout if config.attention_dropout is None else config.attention_dropout
        self.attn_dropout = Dropout(self.dropout)
        self.resid_dropout = Dropout(config.dropout)
        relative = kind != "cross"  # RoPE and ALiBi act in self-attention only
        self.rotary = Rotary(C // config.n_head) if relative and config.pos_encoding == "rope" else None
        slopes = alibi_slopes(config.n_head) if relative and config.pos_encoding == "alibi" else None
        self.register_buffer("slopes", slopes, persistent=False)
        self.qk_norm = config.qk_norm  # parameter-free RMS norm of q and k per head (bounded scores)
        # Token shift at a decoder's attention input (cache shift point 1 + layer); an encoder's block holds its own.
        self.token_shift = TokenShift(C) if self.causal and config.token_shift else None

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        cache: Cache | None = None,
        layer: int = 0,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention of x (B, T, C) at positions pos, (T,) or (B, 1): causal, through `cache` while decoding
        (`layer`: this one's place in it), or both ways over every key but padding (key_mask (B, T): True for real
        characters)."""
        B, T, C = x.shape
        if self.token_shift is not None:  # the layer's input at the previous position, too
            x = self.token_shift(x, cache, 1 + layer)
        if self.causal:
            q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # (B, nh, T, hd)
        else:
            q = heads(self.q(x), self.n_head)  # (B, nh, T, hd)
            k, v = (heads(t, self.n_head) for t in self.kv(x).chunk(2, dim=-1))
        if self.qk_norm:
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        if self.rotary is not None:
            q, k = self.rotary(q, pos), self.rotary(k, pos)
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(layer, k, v)  # (B, nh, S, hd), (S,) or (B, S)
        y: torch.Tensor | None = None
        if key_mask is None and self.slopes is None and not (self.explicit or self.keep_weights):
            # Causal with no bias: the kernel's own mask, or none, where they serve.
            if k.size(2) == T and self.window >= T:  # training, or a first chunk within the window
                dropout = self.dropout if self.training else 0.0
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
            elif T == 1 and k_pos.dim() == 1:  # one new position, every cached key in its window
                y = F.scaled_dot_product_attention(q, k, v)
        if y is None:
            y = self.attend(q, k, v, attention_mask(pos, k_pos, self.window, self.slopes, q.dtype, key_mask))
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C): the heads side by side
        return self.resid_dropout(self.proj(y))

    def read(self, x: torch.Tensor, memory: Memory) -> torch.Tensor:
        """Cross-attention: queries from x (B, T, C), keys and values from `memory` (keys_values of the encoder's
        output, with its mask of real characters)."""
        q = heads(self.q(x), self.n_head)  # (B, nh, T, hd)
        if self.qk_norm:
            q = F.rms_norm(q, (q.size(-1),))
        k, v, key_mask = memory
        y = self.attend(q, k, v, padding_mask(key_mask)).transpose(1, 2).reshape(x.shape)  # (B, T, C)
        return self.resid_dropout(self.proj(y))

    def keys_values(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention's keys and values (B, nh, S, hd) of what is read: computed once per source."""
        k, v = (heads(t, self.n_head) for t in self.kv(source).chunk(2, dim=-1))
        if self.qk_norm:
            k = F.rms_norm(k, (k.size(-1),))
        return k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, nh, T, hd) through a mask or bias (attention_mask's): the fused kernel, or written out."""
        if self.explicit or self.keep_weights:
            y, weights = explicit_attention(q, k, v, mask, self.attn_dropout)
            self.weights = weights if self.keep_weights else None
            return y
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


def share_rotary(model: nn.Module) -> None:
    """One Rotary for every attention of `model` (under RoPE): the angles are computed once per forward pass, not
    once per layer; it holds no weights."""
    rotating = [m for m in model.modules() if isinstance(m, Attention) and m.rotary is not None]
    for m in rotating[1:]:
        m.rotary = rotating[0].rotary


def recorded_attention(modules: list[Attention], forward: Callable[[], object]) -> list[torch.Tensor]:
    """The attention weights each of `modules` computes during `forward()` (their `keep_weights` switched on)."""
    for m in modules:
        m.keep_weights = True
    try:
        forward()
        return [cast(torch.Tensor, m.weights) for m in modules]
    finally:
        for m in modules:
            m.keep_weights, m.weights = False, None
