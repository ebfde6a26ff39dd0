"""The encoder's training batches: BERT's corruption of windows (15% of positions hidden: 80% become the mask
symbol, one id past the text's vocabulary, 10% a random character, 10% stay as they are) and the seeded batches of
hidden windows it trains on."""

from __future__ import annotations

import torch

from charlm.data.corpus import IGNORE, RandomWindows
from charlm.data.prepare import release_mapped_pages

MASK_RATE, MASK_SYMBOL, MASK_RANDOM = 0.15, 0.8, 0.1  # of the chosen positions: 80% mask, 10% random, 10% kept


def hide(x: torch.Tensor, vocab_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's corruption of windows x (B, T): (inputs, targets), targets IGNORE where nothing was hidden."""
    draw = torch.rand(x.shape, generator=generator)  # (B, T); x and the generator on the CPU
    chosen = draw < MASK_RATE
    chosen[torch.arange(x.size(0)), draw.argmin(dim=1)] = True  # at least one per window
    kind = torch.rand(x.shape, generator=generator)  # what a chosen position becomes
    random_chars = torch.randint(vocab_size, x.shape, generator=generator)
    inputs = torch.where(chosen & (kind < MASK_SYMBOL), vocab_size, x)
    inputs = torch.where(chosen & (kind >= MASK_SYMBOL) & (kind < MASK_SYMBOL + MASK_RANDOM), random_chars, inputs)
    return inputs, torch.where(chosen, x, IGNORE)


class MaskedWindows(RandomWindows):
    """Training batches for the encoder: random windows of block_size, then hidden positions, both drawn from the one
    seeded generator (so `--resume` continues exactly); hidden on the CPU, then moved to the device."""

    def __init__(
        self, ids: torch.Tensor, block_size: int, batch_size: int, device: torch.device, seed: int, vocab: int
    ):
        super().__init__(ids, block_size, batch_size, device, seed)
        self.vocab, self.offsets = vocab, torch.arange(block_size)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.ids) - self.block_size, (self.batch_size,), generator=self.generator)
        release_mapped_pages()
        window = self.ids[starts[:, None] + self.offsets].long()  # (B, block_size)
        inputs, targets = hide(window, self.vocab, self.generator)
        return inputs.to(self.device), targets.to(self.device)
