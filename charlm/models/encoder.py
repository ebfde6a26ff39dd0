"""The encoder-only Transformer (model.arch: encoder): BERT's masked-character objective, at character level.

Every block attends both ways (no causal mask), so a position sees the whole window. Training hides 15% of the
positions of each window (charlm/data/masking.py); the loss is the cross-entropy of the original character at
those positions only. The mask symbol is one id past the text's vocabulary (MASK = vocab_size), so the tokenizer
stays the corpus's own; the head scores vocab_size + 1 classes (tying it to the embedding), and filling never picks
the mask symbol (charlm/decoding/fill.py). How well it restores characters: charlm/evaluation/masked.py.
"""

from __future__ import annotations

import torch
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.models.attention import recorded_attention, share_rotary
from charlm.models.block import Block, typed
from charlm.models.layers import Dropout
from charlm.models.transformer import Transformer, absolute_positions, final_norm, output_head, token_shift


class Encoder(Transformer):
    """Token embedding (+ absolute positions), bidirectional blocks, a final norm (pre-LN), and the head."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__(config, vocab_size)
        self.mask_id = vocab_size
        self.tok_emb = nn.Embedding(vocab_size + 1, config.n_embd)  # + the mask symbol
        self.pos_emb = absolute_positions(config)
        self.token_shift = token_shift(config)
        self.drop = Dropout(config.dropout)
        self.encoder = nn.ModuleList(Block(config, "both") for _ in range(config.n_layer))
        share_rotary(self)
        self.ln_f = final_norm(config)
        self.head = output_head(config, self.tok_emb)  # vocab_size + 1 scores
        self.init_weights(depth=config.n_layer)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V + 1) of every position; with targets (IGNORE where not hidden) the mean cross-entropy."""
        B, T = idx.shape
        pos = self.positions(T, 0, None, idx.device)  # (T,)
        x = self.embed(idx, pos, self.tok_emb, self.pos_emb, self.token_shift)  # (B, T, C)
        everything = torch.ones(B, T, dtype=torch.bool, device=idx.device)  # no padding: every key may be seen
        for block in self.encoder:
            x = block(x, pos, key_mask=everything)
        logits = self.logits(x)  # (B, T, V + 1)
        return logits, None if targets is None else self.loss(logits, targets)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """Every layer's weights (n_layer, B, n_head, T, T): full, not triangular."""
        return torch.stack(recorded_attention([block.attn for block in typed(self.encoder)], lambda: self(idx)))
