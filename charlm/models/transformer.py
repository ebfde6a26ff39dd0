"""What every family's model shares around its blocks: characters in (token embedding, absolute positions, token
shift, dropout) and logits out (final norm, output head tied or not, soft-cap), the length check, the loss,
initialisation, decoding caches and the parameter count."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.data.corpus import IGNORE
from charlm.models.kvcache import Cache, CacheT, KVCache
from charlm.models.layers import (
    MixtureOfExperts,
    ResidualProjection,
    SinusoidalPositions,
    TokenShift,
    make_norm,
)
from charlm.models.linear import Linear


def absolute_positions(config: ModelConfig) -> nn.Module | None:
    """The module adding positions to the embeddings; None for relative encodings, which act inside attention."""
    if config.pos_encoding == "learned":
        return nn.Embedding(config.block_size, config.n_embd)
    if config.pos_encoding == "sinusoidal":
        return SinusoidalPositions(config.block_size, config.n_embd)
    return None


def token_shift(config: ModelConfig) -> TokenShift | None:
    """model.token_shift at the embeddings (shift point 0)."""
    return TokenShift(config.n_embd) if config.token_shift else None


def final_norm(config: ModelConfig) -> nn.Module:
    """The norm before the head (or an encoder's output) under pre-LN; post-LN blocks already end in a norm."""
    return make_norm(config) if config.norm_position == "pre" else nn.Identity()


def output_head(config: ModelConfig, table: nn.Embedding) -> Linear:
    """Width -> a score per row of the token table; the table's own weights when model.tie_weights."""
    head = Linear(config.n_embd, table.num_embeddings, bias=config.head_bias)
    if config.tie_weights:
        head.weight = table.weight
    return head


def init_weights(module: nn.Module, config: ModelConfig, depth: int) -> None:
    """model.init for one module: gpt2 = N(0, 0.02), residual projections scaled by 1/sqrt(2 x depth) (depth: the
    blocks the residual stream passes), zero biases; torch keeps each layer's own initialisation (zero_init_proj
    still zeroes the residual projections)."""
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


class Transformer(nn.Module):
    """The base of the three families. A family's __init__ makes its modules in the order, and under the names, its
    checkpoints hold them (the order in which weights are drawn and an optimizer's state is listed), among them
    tok_emb, drop, ln_f and head for the ends written here; then it calls init_weights."""

    tok_emb: nn.Embedding
    drop: nn.Dropout
    ln_f: nn.Module
    head: Linear

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__()
        self.config, self.vocab_size = config, vocab_size
        self.label_smoothing = 0.0  # a training setting (train.label_smoothing): the trainer sets it
        # The original paper scales embeddings by sqrt(d) before adding the fixed sinusoids; without it the
        # unit-amplitude sinusoids swamp the small initial embeddings (docs/benchmarks.md has the cost).
        self.embed_scale = math.sqrt(config.n_embd) if config.pos_encoding == "sinusoidal" else 1.0

    @property
    def relative_positions(self) -> bool:
        """Whether attention depends on distances only, so that a text may outgrow block_size (GPT's RoPE, ALiBi)."""
        return False

    def init_weights(self, depth: int) -> None:
        self.apply(lambda module: init_weights(module, self.config, depth))

    def check_length(self, length: int) -> None:
        """Refuse a text of more positions than absolute encodings have (relative ones take any number)."""
        if not self.relative_positions and length > self.config.block_size:
            raise ValueError(
                f"sequence of length {length} is longer than the model's block_size {self.config.block_size}"
            )

    def positions(self, length: int, start: int, cache: Cache | None, device: torch.device) -> torch.Tensor:
        """The positions of `length` new tokens, (T,) from `start`; with a cache, those it gives them: (T,) going on
        from its text, or (B, 1) when each row continues its own."""
        if cache is not None:
            return cache.begin(length, start, self.check_length)
        self.check_length(start + length)
        return torch.arange(start, start + length, device=device)

    def embed(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        table: nn.Embedding,
        positions: nn.Module | None,
        shift: TokenShift | None,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """The input (B, T, C) of ids (B, T) at positions pos: their rows of the token table (scaled by sqrt(d)
        under sinusoids), token shift (shift point 0), absolute positions added, dropout."""
        x = table(ids)  # (B, T, C)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        if shift is not None:
            x = shift(x, cache)
        if positions is not None:
            x = x + positions(pos)
        return self.drop(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output (B, T, C) -> logits (B, T, V): final norm, head, and the soft-cap c tanh(z / c),
        which keeps logits in (-c, c) smoothly."""
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if self.config.logit_softcap:
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits / c)
        return logits

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the targets that are not IGNORE; while training, with the trainer's label
        smoothing and, in a mixture of experts, plus the routers' load-balancing term."""
        smoothing = self.label_smoothing if self.training else 0.0
        flat = logits.float().view(-1, logits.size(-1))
        loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE, label_smoothing=smoothing)
        if self.training and self.config.n_experts:
            mixtures = [m for m in self.modules() if isinstance(m, MixtureOfExperts)]
            loss = loss + self.config.moe_aux_weight * sum(m.aux_loss for m in mixtures) / len(mixtures)
        return loss

    def new_cache(self, batch: int, device: torch.device, dtype: torch.dtype = torch.float32) -> KVCache:
        return self.empty_cache(KVCache, batch, device, dtype)

    def empty_cache(self, kind: type[CacheT], batch: int, device: torch.device, dtype: torch.dtype) -> CacheT:
        """An empty cache of any kind (KVCache, RowCache, StaticCache) for the causal self-attention of n_layer
        blocks."""
        c = self.config
        return kind(c.n_layer, batch, c.n_head, c.block_size, c.n_embd // c.n_head, device, dtype)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
