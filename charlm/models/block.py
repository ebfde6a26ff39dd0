"""One Transformer layer for every family: self-attention, cross-attention when a decoder reads an encoder, then the
feed-forward (dense or a mixture of experts), each sublayer a residual branch with its norm before or after it."""

from __future__ import annotations

from typing import Literal, cast

import torch
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.models.attention import Attention, Memory
from charlm.models.kvcache import Cache
from charlm.models.layers import TokenShift, feed_forward, make_norm


class Block(nn.Module):
    """pre: x + f(norm(x)) for each sublayer f (GPT-2); post: norm(x + f(x)) (the original paper).

    attention: "causal" (a decoder's self-attention) or "both" (an encoder's). reads_encoder: a decoder block of an
    encoder-decoder, with cross-attention to the encoder's output between its self-attention and its feed-forward
    (unless model.cross_attention is off). The submodules keep the names checkpoints hold them under: norms numbered
    by sublayer (ln_1 self-attention, ln_2 cross-attention, ln_3 the feed-forward behind it; ln_2 the feed-forward of
    a block that reads no encoder), and token shift in the block for attention both ways, where a causal attention
    holds its own (it needs the cache's memory across steps).
    """

    def __init__(self, config: ModelConfig, attention: Literal["causal", "both"], reads_encoder: bool = False):
        super().__init__()
        self.pre = config.norm_position == "pre"
        self.reads_encoder = reads_encoder
        self.ln_1, self.attn = make_norm(config), Attention(config, attention)
        self.cross: Attention | None = None
        if reads_encoder and config.cross_attention:
            self.ln_2, self.cross = make_norm(config), Attention(config, "cross")
        if reads_encoder:
            self.ln_3 = make_norm(config)
        else:
            self.ln_2 = make_norm(config)
        self.mlp = feed_forward(config)  # dense, or a mixture of experts
        self.token_shift = TokenShift(config.n_embd) if attention == "both" and config.token_shift else None

    @property
    def ffn_norm(self) -> nn.Module:
        """The feed-forward's norm: ln_3 behind a cross-attention sublayer's place, else ln_2."""
        return self.ln_3 if self.reads_encoder else self.ln_2

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        cache: Cache | None = None,
        layer: int = 0,
        key_mask: torch.Tensor | None = None,
        memory: Memory | None = None,
    ) -> torch.Tensor:
        """x (B, T, C) at positions pos. cache, layer: a decoder's cache while decoding, and this block's place in
        it; key_mask (B, T): attention both ways, True for real characters; memory: what cross-attention reads."""
        if self.pre:
            h = self.ln_1(x)
            if self.token_shift is not None:
                h = self.token_shift(h)
            x = x + self.attn(h, pos, cache, layer, key_mask)
            if memory is not None:
                x = x + cast(Attention, self.cross).read(self.ln_2(x), memory)
            return x + self.mlp(self.ffn_norm(x))
        h = x if self.token_shift is None else self.token_shift(x)
        x = self.ln_1(x + self.attn(h, pos, cache, layer, key_mask))
        if memory is not None:
            x = self.ln_2(x + cast(Attention, self.cross).read(x, memory))
        return self.ffn_norm(x + self.mlp(x))


def typed(stack: nn.ModuleList) -> list[Block]:
    """A stack's blocks, typed (an nn.ModuleList only promises Modules)."""
    return cast("list[Block]", list(stack))
