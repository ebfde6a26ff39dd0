"""Decoder-only Transformer for characters: one small class per concept, shapes in comments.

The design choices from the classic texts are config keys (see ModelConfig): positional encoding, norm and its
position, activation, feed-forward width, weight tying, biases. Their building blocks live in layers.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.models.kvcache import AnyCache, CacheT, KVCache, RowCache
from charlm.models.layers import (
    MixtureOfExperts,
    ResidualProjection,
    Rotary,
    SinusoidalPositions,
    TokenShift,
    alibi_slopes,
    attention_mask,
    feed_forward,
    make_norm,
    part_bias,
)
from charlm.models.linear import Linear

RELATIVE = ("rope", "alibi")  # encodings under which attention depends on distances only


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q Kᵀ / √d_head + M) V, one step per line.

    Returns the output (B, nh, T, hd) and the weights (B, nh, T, S).

    mask: True where a query may attend (T, S), or an additive bias (nh, T, S) with -inf where it may not (ALiBi).
    """
    scale = q.size(-1) ** -0.5  # 1 / √d_head
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, hd) @ (B, nh, hd, S) -> (B, nh, T, S)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))  # the future (and beyond the window) gets no weight
    else:
        scores = scores + mask  # ALiBi: -slope x distance, -inf outside the window
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, nh, T, S), each row sums to 1
    return dropout(weights) @ v, weights  # (B, nh, T, S) @ (B, nh, S, hd) -> (B, nh, T, hd)


def init_weights(module: nn.Module, config: ModelConfig, depth: int) -> None:
    """model.init for one module (every family's): gpt2 = N(0, 0.02), residual projections scaled by
    1/sqrt(2 x depth) (depth: the blocks the residual stream passes), zero biases; torch keeps each layer's own
    initialisation (zero_init_proj still zeroes the residual projections)."""
    if config.init == "torch":
        if config.zero_init_proj and isinstance(module, ResidualProjection):
            nn.init.zeros_(module.weight)
        return
    if isinstance(module, nn.Linear):
        std = 0.02
        if isinstance(module, ResidualProjection):
            std = 0.0 if config.zero_init_proj else std / math.sqrt(2 * depth)
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def recorded_attention(modules: list, forward: Callable[[], object]) -> list[torch.Tensor]:
    """The attention weights each of `modules` computes during `forward()` (their `keep_weights` switched on)."""
    for m in modules:
        m.keep_weights = True
    try:
        forward()
        return [cast(torch.Tensor, m.weights) for m in modules]
    finally:
        for m in modules:
            m.keep_weights, m.weights = False, None


class CausalSelfAttention(nn.Module):
    """All heads in one QKV projection; attention by the fused kernel, or written out (model.attention: explicit).

    Set `keep_weights` to record the attention weights of the next forward pass in `weights` (explicit path).
    """

    slopes: torch.Tensor | None  # ALiBi's per-head slopes (a buffer), or None

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head = config.n_head
        self.window = config.block_size  # each position sees itself and block_size - 1 before it
        self.explicit = config.attention == "explicit"
        self.keep_weights = False
        self.weights: torch.Tensor | None = None  # (B, nh, T, S) of the last forward, when keep_weights
        self.qkv = Linear(config.n_embd, 3 * config.n_embd, bias=part_bias(config, "qkv"))
        self.proj = ResidualProjection(config.n_embd, config.n_embd, bias=part_bias(config, "proj"))
        self.dropout = config.dropout
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rotary = Rotary(config.n_embd // config.n_head) if config.pos_encoding == "rope" else None
        slopes = alibi_slopes(config.n_head) if config.pos_encoding == "alibi" else None
        self.register_buffer("slopes", slopes, persistent=False)
        self.qk_norm = config.qk_norm  # parameter-free RMS norm of q and k per head (bounded scores)
        self.token_shift = TokenShift(config.n_embd) if config.token_shift else None

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, cache: AnyCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, C = x.shape
        if self.token_shift is not None:  # the layer's input at the previous position, too (cache shift point 1 + l)
            x = self.token_shift(x, cache, 1 + layer)
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # 3 x (B, nh, T, hd)
        if self.qk_norm:
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        if self.rotary is not None:
            q, k = self.rotary(q, pos), self.rotary(k, pos)
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(layer, k, v)  # (B, nh, S, hd), (S,)
        y = self._attend(q, k, v, pos, k_pos)  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))

    def _attend(self, q, k, v, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        T, S = q.size(2), k.size(2)
        if self.explicit or self.keep_weights:
            mask = attention_mask(q_pos, k_pos, self.window, self.slopes, q.dtype)  # (T, S) or (nh, T, S)
            y, weights = explicit_attention(q, k, v, mask, self.attn_dropout)
            self.weights = weights if self.keep_weights else None
            return y
        dropout = self.dropout if self.training else 0.0
        if self.slopes is None and T == S and self.window >= T:  # training, or a first chunk within the window
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        if self.slopes is None and T == 1 and k_pos.dim() == 1:  # one new position, every cached key in its window
            return F.scaled_dot_product_attention(q, k, v)
        mask = attention_mask(q_pos, k_pos, self.window, self.slopes, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


class Block(nn.Module):
    """Residual block. pre: x + attn(norm(x)), then x + mlp(norm(x)); post: norm(x + attn(x)), then norm(x + mlp(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre = config.norm_position == "pre"
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = feed_forward(config)  # dense, or a mixture of experts

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, cache: AnyCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        if self.pre:
            x = x + self.attn(self.ln_1(x), pos, cache, layer)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x, pos, cache, layer))
        return self.ln_2(x + self.mlp(x))


def absolute_positions(config: ModelConfig) -> nn.Module | None:
    """The module adding positions to the embeddings; None for relative encodings, which act inside attention."""
    if config.pos_encoding == "learned":
        return nn.Embedding(config.block_size, config.n_embd)
    if config.pos_encoding == "sinusoidal":
        return SinusoidalPositions(config.block_size, config.n_embd)
    return None


class GPT(nn.Module):
    """Token embedding (+ absolute positions), n_layer blocks, a final norm (pre-LN), and the output head."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.tok_emb = nn.Embedding(vocab_size, config.n_embd)
        self.pos_emb = absolute_positions(config)
        self.token_shift = TokenShift(config.n_embd) if config.token_shift else None
        # The original paper scales embeddings by sqrt(d) before adding the fixed sinusoids; without it the
        # unit-amplitude sinusoids swamp the small initial embeddings (docs/benchmarks.md has the cost).
        self.embed_scale = math.sqrt(config.n_embd) if config.pos_encoding == "sinusoidal" else 1.0
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        if config.pos_encoding == "rope":  # one Rotary for every layer: the angles are computed once per forward pass
            shared = self.block_list[0].attn.rotary
            for block in self.block_list[1:]:
                block.attn.rotary = shared
        # Post-LN blocks already end in a norm; pre-LN needs one before the head.
        self.ln_f = make_norm(config) if config.norm_position == "pre" else nn.Identity()
        self.head = Linear(config.n_embd, vocab_size, bias=config.head_bias)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @property
    def relative_positions(self) -> bool:
        """True when attention depends only on distances, so the context can roll instead of being re-encoded."""
        return self.config.pos_encoding in RELATIVE

    @property
    def reach(self) -> int:
        """How many positions the last position's logits depend on under relative positions: itself and n_layer
        sliding windows of block_size - 1 before it; with token shift one more per layer and one for the embeddings
        (each shift point's predecessor)."""
        c = self.config
        return c.n_layer * (c.block_size - 1) + 1 + (c.n_layer + 1 if c.token_shift else 0)

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config, self.config.n_layer)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: AnyCache | None = None,
        start_pos: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) and, with targets, the mean cross-entropy.

        Positions start at start_pos, or continue the cached text (a RowCache: each row's own text). Absolute
        encodings allow at most block_size positions; relative ones any number, each position attending to the
        block_size - 1 before it.
        """
        _, T = idx.shape
        if isinstance(cache, RowCache):  # serving: each row continues its own text at its own position
            pos = cache.begin_step(T)  # (B, 1)
        else:
            first = cache.length if cache is not None and cache.length else start_pos
            if not self.relative_positions and first + T > self.config.block_size:
                raise ValueError(
                    f"sequence of length {first + T} is longer than the model's block_size {self.config.block_size}"
                )
            pos = torch.arange(first, first + T, device=idx.device)  # (T,)
            if cache is not None:
                cache.advance(pos, first + T)
        logits = self.logits_at(idx, pos, cache)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        if self.training and self.config.n_experts:  # the router's load balancing: a training term only
            aux = sum(cast(MixtureOfExperts, b.mlp).aux_loss for b in self.block_list)
            loss = loss + self.config.moe_aux_weight * aux / len(self.blocks)
        return logits, loss

    def logits_at(self, idx: torch.Tensor, pos: torch.Tensor, cache: AnyCache | None = None) -> torch.Tensor:
        """Logits (B, T, V) of idx (B, T) at positions pos, (T,) or (B, 1), the cache already holding their slots.

        No Python number depends on the step here, so a compiled decoding step (charlm/decoding/compiled.py) traces
        it once for every position."""
        x = self.tok_emb(idx)  # (B, T, C)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        if self.token_shift is not None:
            x = self.token_shift(x, cache)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        x = self.drop(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, pos, cache, layer)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if self.config.logit_softcap:  # smooth cap: c * tanh(z / c), logits stay in (-c, c)
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits / c)
        return logits

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """Every layer's attention weights for a (B, T) input: (n_layer, B, n_head, T, T), rows summing to 1."""
        return torch.stack(recorded_attention([block.attn for block in self.block_list], lambda: self(idx)))

    @property
    def block_list(self) -> list[Block]:
        """The blocks, typed (an nn.ModuleList only promises Modules)."""
        return cast("list[Block]", list(self.blocks))

    def new_cache(self, batch: int, device: torch.device, dtype: torch.dtype = torch.float32) -> KVCache:
        return self.empty_cache(KVCache, batch, device, dtype)

    def new_row_cache(self, rows: int, device: torch.device, dtype: torch.dtype = torch.float32) -> RowCache:
        return self.empty_cache(RowCache, rows, device, dtype)

    def empty_cache(self, kind: type[CacheT], batch: int, device: torch.device, dtype: torch.dtype) -> CacheT:
        """An empty cache of this model's shape, of any kind (KVCache, RowCache, StaticCache)."""
        c = self.config
        return kind(c.n_layer, batch, c.n_head, c.block_size, c.n_embd // c.n_head, device, dtype)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
