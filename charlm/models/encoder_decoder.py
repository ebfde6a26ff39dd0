"""The encoder–decoder Transformer (model.arch: encoder-decoder): a source string in, a target string out.

The original paper's architecture at character level, built from the decoder-only model's parts. The encoder's
blocks attend both ways over the source (padding masked out); the decoder's blocks attend causally over the target
so far, then across to the encoder's output (cross-attention), then apply the feed-forward. One character
vocabulary serves both sides, its first ids reserved: PAD 0, BOS 1 (starts every target), EOS 2 (ends it).

Positions: learned and sinusoidal tables are added on each side (a table each); RoPE and ALiBi act in both sides'
self-attention. Cross-attention gets no positional term: a source position and a target position are not on one
axis, so their distance means nothing; the alignment is learned from content (and the positions inside it).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.data.corpus import IGNORE
from charlm.data.tokenizer import PAD
from charlm.models.decoder import (
    CausalSelfAttention,
    absolute_positions,
    explicit_attention,
    init_weights,
    recorded_attention,
)
from charlm.models.kvcache import KVCache
from charlm.models.layers import (
    ResidualProjection,
    Rotary,
    TokenShift,
    alibi_slopes,
    feed_forward,
    make_norm,
    part_bias,
)
from charlm.models.linear import Linear


def heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) -> (B, nh, T, hd)."""
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head attention over keys that all may be seen, but padding: the encoder's self-attention, and cross-
    attention (queries from the decoder, keys and values from the encoder's output).

    Set `keep_weights` to record the weights of the next forward pass in `weights`.
    """

    slopes: torch.Tensor | None

    def __init__(self, config: ModelConfig, cross: bool):
        super().__init__()
        C, self.n_head, self.cross = config.n_embd, config.n_head, cross
        self.q = Linear(C, C, bias=part_bias(config, "qkv"))
        self.kv = Linear(C, 2 * C, bias=part_bias(config, "qkv"))
        self.proj = ResidualProjection(C, C, bias=part_bias(config, "proj"))
        self.explicit, self.qk_norm = config.attention == "explicit", config.qk_norm
        self.keep_weights, self.weights = False, cast("torch.Tensor | None", None)
        self.attn_dropout, self.resid_dropout = nn.Dropout(config.dropout), nn.Dropout(config.dropout)
        self.dropout = config.dropout
        relative = not cross  # see the module's docstring: no positions across the two sides
        self.rotary = Rotary(C // config.n_head) if relative and config.pos_encoding == "rope" else None
        slopes = alibi_slopes(config.n_head) if relative and config.pos_encoding == "alibi" else None
        self.register_buffer("slopes", slopes, persistent=False)

    def keys_values(self, source: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, nh, S, hd) of what is attended to: computed once per source when decoding."""
        k, v = self.kv(source).chunk(2, dim=-1)
        k, v = heads(k, self.n_head), heads(v, self.n_head)
        if self.qk_norm:
            k = F.rms_norm(k, (k.size(-1),))
        if self.rotary is not None:
            k = self.rotary(k, pos)
        return k, v

    def forward(
        self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], key_mask: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        """x (B, T, C) queries; kv from keys_values; key_mask (B, S), True where a key is a real character."""
        q = heads(self.q(x), self.n_head)  # (B, nh, T, hd)
        if self.qk_norm:
            q = F.rms_norm(q, (q.size(-1),))
        if self.rotary is not None:
            q = self.rotary(q, pos)
        k, v = kv
        mask: torch.Tensor = key_mask[:, None, None, :]  # (B, 1, 1, S): padding gets no weight
        if self.slopes is not None:  # ALiBi both ways: -slope x |distance|
            distance = (pos[:, None] - pos[None, :]).abs().to(q.dtype)  # (T, S)
            bias = -self.slopes.to(q.dtype)[:, None, None] * distance  # (nh, T, S)
            mask = bias.masked_fill(~mask, float("-inf"))  # (B, nh, T, S)
        if self.explicit or self.keep_weights:
            y, weights = explicit_attention(q, k, v, mask, self.attn_dropout)
            self.weights = weights if self.keep_weights else None
        else:
            dropout = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        y = y.transpose(1, 2).reshape(x.shape)  # (B, T, C)
        return self.resid_dropout(self.proj(y))


class EncoderBlock(nn.Module):
    """Self-attention both ways, then the feed-forward, each with its norm (pre or post) and residual."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre = config.norm_position == "pre"
        self.ln_1, self.attn = make_norm(config), Attention(config, cross=False)
        self.ln_2, self.mlp = make_norm(config), feed_forward(config)
        self.token_shift = TokenShift(config.n_embd) if config.token_shift else None  # as the decoder's attention

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x) if self.pre else x
        if self.token_shift is not None:
            h = self.token_shift(h)
        y = self.attn(h, self.attn.keys_values(h, pos), key_mask, pos)
        if self.pre:
            x = x + y
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + y)
        return self.ln_2(x + self.mlp(x))


class DecoderBlock(nn.Module):
    """Causal self-attention (KV-cached when decoding), cross-attention to the encoder, then the feed-forward."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre = config.norm_position == "pre"
        self.ln_1, self.attn = make_norm(config), CausalSelfAttention(config)
        self.cross: Attention | None = None
        if config.cross_attention:
            self.ln_2, self.cross = make_norm(config), Attention(config, cross=True)
        self.ln_3, self.mlp = make_norm(config), feed_forward(config)

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        memory: tuple[torch.Tensor, torch.Tensor] | None,
        key_mask: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """memory: this block's cross-attention keys and values of the encoder's output (None without it)."""
        if self.pre:
            x = x + self.attn(self.ln_1(x), pos, cache, layer)
            if self.cross is not None and memory is not None:
                x = x + self.cross(self.ln_2(x), memory, key_mask, pos)
            return x + self.mlp(self.ln_3(x))
        x = self.ln_1(x + self.attn(x, pos, cache, layer))
        if self.cross is not None and memory is not None:
            x = self.ln_2(x + self.cross(x, memory, key_mask, pos))
        return self.ln_3(x + self.mlp(x))


class EncoderDecoder(nn.Module):
    """Embeddings (+ absolute positions) on each side, the encoder, the decoder, a final norm (pre-LN) and the head."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__()
        self.config, self.vocab_size = config, vocab_size
        C = config.n_embd
        self.tok_emb = nn.Embedding(vocab_size, C)  # the target side's (and the source's, when shared)
        self.src_emb = None if config.share_embeddings else nn.Embedding(vocab_size, C)
        self.src_pos, self.pos_emb = absolute_positions(config), absolute_positions(config)
        shift = config.token_shift  # one on each side: a source's characters and a target's differ in role
        self.src_token_shift, self.token_shift = (TokenShift(C) if shift else None for _ in range(2))
        self.embed_scale = math.sqrt(C) if config.pos_encoding == "sinusoidal" else 1.0  # as GPT, for sinusoids
        self.drop = nn.Dropout(config.dropout)
        n_encoder = config.n_encoder_layer or config.n_layer
        self.encoder = nn.ModuleList(EncoderBlock(config) for _ in range(n_encoder))
        self.decoder = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layer))
        pre = config.norm_position == "pre"  # post-LN blocks already end in a norm
        self.ln_enc = make_norm(config) if pre else nn.Identity()
        self.ln_f = make_norm(config) if pre else nn.Identity()
        self.head = Linear(C, vocab_size, bias=config.head_bias)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    relative_positions = False  # the decoder never rolls its window: a target fits in block_size

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config, (self.config.n_encoder_layer or self.config.n_layer) + self.config.n_layer)

    def _embed(
        self,
        ids: torch.Tensor,
        table: nn.Embedding,
        positions: nn.Module | None,
        shift: TokenShift | None,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The embeddings (B, T, C) of ids (B, T) and their positions (T,), which continue a cache's."""
        start, T = (cache.length if cache is not None else 0), ids.size(1)
        self.check_length(start + T)
        pos = torch.arange(start, start + T, device=ids.device)  # (T,)
        if cache is not None:
            cache.advance(pos, start + T)
        x = table(ids) * self.embed_scale if self.embed_scale != 1.0 else table(ids)  # (B, T, C)
        if shift is not None:
            x = shift(x, cache)
        if positions is not None:
            x = x + positions(pos)
        return self.drop(x), pos

    def check_length(self, length: int) -> None:
        if length > self.config.block_size:
            raise ValueError(
                f"sequence of length {length} is longer than the model's block_size {self.config.block_size}"
            )

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output (B, S, C) for padded sources (B, S), and the mask of real characters (B, S)."""
        key_mask = src != PAD
        x, pos = self._embed(src, self.src_emb or self.tok_emb, self.src_pos, self.src_token_shift)
        for block in self.encoder_blocks:
            x = block(x, key_mask, pos)
        return self.ln_enc(x), key_mask

    def memory(self, encoded: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Each decoder block's cross-attention keys and values of the encoder's output (once per source)."""
        empty = torch.arange(encoded.size(1), device=encoded.device)
        return [None if b.cross is None else b.cross.keys_values(encoded, empty) for b in self.decoder_blocks]

    def decode(
        self,
        tgt: torch.Tensor,
        memory: list[tuple[torch.Tensor, torch.Tensor] | None],
        key_mask: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V) for the target so far (B, T), which begins with BOS; with a cache, only new positions."""
        x, pos = self._embed(tgt, self.tok_emb, self.pos_emb, self.token_shift, cache)
        for layer, (block, kv) in enumerate(zip(self.decoder_blocks, memory, strict=True)):
            x = block(x, pos, kv, key_mask, cache, layer)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if self.config.logit_softcap:
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits / c)
        return logits

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: logits (B, T, V) for BOS + target, and with targets (target + EOS, IGNORE where padded)
        the mean cross-entropy over target characters."""
        encoded, key_mask = self.encode(src)
        logits = self.decode(tgt_in, self.memory(encoded), key_mask)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE)
        return logits, loss

    @torch.no_grad()
    def attention_weights(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every layer's weights: encoder (Le, B, nh, S, S), decoder (Ld, B, nh, T, T), cross (Ld, B, nh, T, S)."""
        groups: dict[str, list[Any]] = {
            "encoder": [b.attn for b in self.encoder_blocks],
            "decoder": [b.attn for b in self.decoder_blocks],
            "cross": [b.cross for b in self.decoder_blocks if b.cross is not None],
        }
        kept = recorded_attention([m for group in groups.values() for m in group], lambda: self(src, tgt_in))
        maps, start = {}, 0
        for name, group in groups.items():
            if group:
                maps[name], start = torch.stack(kept[start : start + len(group)]), start + len(group)
        return maps

    @property
    def encoder_blocks(self) -> list[EncoderBlock]:
        return cast("list[EncoderBlock]", list(self.encoder))

    @property
    def decoder_blocks(self) -> list[DecoderBlock]:
        return cast("list[DecoderBlock]", list(self.decoder))

    def new_cache(self, batch: int, device: torch.device, dtype: torch.dtype = torch.float32) -> KVCache:
        c = self.config
        return KVCache(c.n_layer, batch, c.n_head, c.block_size, c.n_embd // c.n_head, device, dtype)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
