"""Decoder-only Transformer for characters (GPT): the shared ends around n_layer causal blocks.

The design choices from the classic texts are config keys (see ModelConfig): positional encoding, norm and its
position, activation, feed-forward width, weight tying, biases. Their building blocks live in layers.py, attention
in attention.py, the residual block in block.py, the embeddings and the head in transformer.py.
"""

from __future__ import annotations

import torch
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.models.attention import recorded_attention, share_rotary
from charlm.models.block import Block, typed
from charlm.models.kvcache import Cache, RowCache
from charlm.models.layers import Dropout
from charlm.models.transformer import Transformer, absolute_positions, final_norm, output_head, token_shift

RELATIVE = ("rope", "alibi")  # encodings under which attention depends on distances only


class Decoder(Transformer):
    """Token embedding (+ absolute positions), n_layer blocks, a final norm (pre-LN), and the output head."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__(config, vocab_size)
        self.tok_emb = nn.Embedding(vocab_size, config.n_embd)
        self.pos_emb = absolute_positions(config)
        self.token_shift = token_shift(config)
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, "causal") for _ in range(config.n_layer))
        share_rotary(self)
        self.ln_f = final_norm(config)
        self.head = output_head(config, self.tok_emb)
        self.init_weights(depth=config.n_layer)

    @property
    def relative_positions(self) -> bool:
        """True when attention depends only on distances, so the context can roll instead of being re-encoded."""
        return relative_positions(self.config)

    @property
    def reach(self) -> int:
        """How many positions the last position's logits depend on under relative positions (decoder_reach)."""
        return decoder_reach(self.config)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: Cache | None = None,
        start_pos: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) and, with targets, the mean cross-entropy.

        Positions start at start_pos, or continue the cached text (each row its own, in a RowCache). Absolute
        encodings allow at most block_size positions; relative ones any number, each position attending to the
        block_size - 1 before it.
        """
        pos = self.positions(idx.size(1), start_pos, cache, idx.device)  # (T,) or (B, 1)
        logits = self.logits_at(idx, pos, cache)
        return logits, None if targets is None else self.loss(logits, targets)

    def logits_at(self, idx: torch.Tensor, pos: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """Logits (B, T, V) of idx (B, T) at positions pos, (T,) or (B, 1), the cache already holding their slots.

        No Python number depends on the step here, so a compiled decoding step (charlm/decoding/compiled.py) traces
        it once for every position."""
        x = self.embed(idx, pos, self.tok_emb, self.pos_emb, self.token_shift, cache)  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, pos, cache, layer)
        return self.logits(x)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """Every layer's attention weights for a (B, T) input: (n_layer, B, n_head, T, T), rows summing to 1."""
        return torch.stack(recorded_attention([block.attn for block in typed(self.blocks)], lambda: self(idx)))

    def new_row_cache(self, rows: int, device: torch.device, dtype: torch.dtype = torch.float32) -> RowCache:
        return self.empty_cache(RowCache, rows, device, dtype)


def relative_positions(config: ModelConfig) -> bool:
    """Whether a decoder of this config attends by distances only (RoPE, ALiBi)."""
    return config.pos_encoding in RELATIVE


def decoder_reach(config: ModelConfig) -> int:
    """How many positions the last position's logits depend on under relative positions: itself and n_layer sliding
    windows of block_size - 1 before it; with token shift one more per layer and one for the embeddings (each shift
    point's predecessor)."""
    c = config
    return c.n_layer * (c.block_size - 1) + 1 + (c.n_layer + 1 if c.token_shift else 0)
