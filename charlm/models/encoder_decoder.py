"""The encoder–decoder Transformer (model.arch: encoder-decoder): a source string in, a target string out.

The original paper's architecture at character level, from the parts every family shares. The encoder's blocks
attend both ways over the source (padding masked out); the decoder's blocks attend causally over the target so far,
then across to the encoder's output (cross-attention), then apply the feed-forward. One character vocabulary serves
both sides, its first ids reserved: PAD 0, BOS 1 (starts every target), EOS 2 (ends it).

Positions: learned and sinusoidal tables are added on each side (a table each); RoPE and ALiBi act in both sides'
self-attention. Cross-attention gets no positional term: a source position and a target position are not on one
axis, so their distance means nothing; the alignment is learned from content (and the positions inside it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.data.tokenizer import PAD
from charlm.models.attention import recorded_attention, share_rotary
from charlm.models.block import Block, typed
from charlm.models.kvcache import KVCache
from charlm.models.layers import Dropout
from charlm.models.transformer import Transformer, absolute_positions, final_norm, output_head, token_shift

KeysValues = tuple[torch.Tensor, torch.Tensor]  # one decoder block's cross-attention keys and values (B, nh, S, hd)


class EncoderDecoder(Transformer):
    """Embeddings (+ absolute positions) on each side, the encoder, the decoder, a final norm (pre-LN) and the head."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__(config, vocab_size)
        C = config.n_embd
        self.tok_emb = nn.Embedding(vocab_size, C)  # the target side's (and the source's, when shared)
        self.src_emb = None if config.share_embeddings else nn.Embedding(vocab_size, C)
        self.src_pos, self.pos_emb = absolute_positions(config), absolute_positions(config)
        # Token shift on each side: a source's characters and a target's differ in role.
        self.src_token_shift, self.token_shift = token_shift(config), token_shift(config)
        self.drop = Dropout(config.dropout)
        n_encoder = config.n_encoder_layer or config.n_layer
        self.encoder = nn.ModuleList(Block(config, "both") for _ in range(n_encoder))
        self.decoder = nn.ModuleList(Block(config, "causal", reads_encoder=True) for _ in range(config.n_layer))
        share_rotary(self)
        self.ln_enc, self.ln_f = final_norm(config), final_norm(config)
        self.head = output_head(config, self.tok_emb)
        self.init_weights(depth=n_encoder + config.n_layer)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output (B, S, C) for padded sources (B, S), and the mask of real characters (B, S)."""
        key_mask = src != PAD
        pos = self.positions(src.size(1), 0, None, src.device)  # (S,)
        x = self.embed(src, pos, self.src_emb or self.tok_emb, self.src_pos, self.src_token_shift)
        for block in self.encoder:
            x = block(x, pos, key_mask=key_mask)
        return self.ln_enc(x), key_mask

    def memory(self, encoded: torch.Tensor) -> list[KeysValues | None]:
        """Each decoder block's cross-attention keys and values of the encoder's output (once per source)."""
        return [None if block.cross is None else block.cross.keys_values(encoded) for block in typed(self.decoder)]

    def decode(
        self,
        tgt: torch.Tensor,
        memory: list[KeysValues | None],
        key_mask: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V) for the target so far (B, T), which begins with BOS; with a cache, only new positions."""
        pos = self.positions(tgt.size(1), 0, cache, tgt.device)  # (T,), going on from the cached target
        x = self.embed(tgt, pos, self.tok_emb, self.pos_emb, self.token_shift, cache)  # (B, T, C)
        for layer, (block, kv) in enumerate(zip(self.decoder, memory, strict=True)):
            x = block(x, pos, cache, layer, memory=None if kv is None else (*kv, key_mask))
        return self.logits(x)

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: logits (B, T, V) for BOS + target, and with targets (target + EOS, IGNORE where padded)
        the mean cross-entropy over target characters."""
        encoded, key_mask = self.encode(src)
        logits = self.decode(tgt_in, self.memory(encoded), key_mask)
        return logits, None if targets is None else self.loss(logits, targets)

    @torch.no_grad()
    def attention_weights(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every layer's weights: encoder (Le, B, nh, S, S), decoder (Ld, B, nh, T, T), cross (Ld, B, nh, T, S)."""
        groups: dict[str, list[Any]] = {
            "encoder": [block.attn for block in typed(self.encoder)],
            "decoder": [block.attn for block in typed(self.decoder)],
            "cross": [block.cross for block in typed(self.decoder) if block.cross is not None],
        }
        kept = recorded_attention([m for group in groups.values() for m in group], lambda: self(src, tgt_in))
        maps, start = {}, 0
        for name, group in groups.items():
            if group:
                maps[name], start = torch.stack(kept[start : start + len(group)]), start + len(group)
        return maps
