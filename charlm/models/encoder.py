"""The encoder-only Transformer (model.arch: encoder): BERT's masked-character objective, at character level.

Every block attends both ways (no causal mask), so a position sees the whole window. Training hides 15% of the
positions of each window: 80% of those become the mask symbol, 10% a random character, 10% stay as they are; the
loss is the cross-entropy of the original character at those positions only. The mask symbol is one id past the
text's vocabulary (MASK = vocab_size), so the tokenizer stays the corpus's own; the head scores vocab_size + 1
classes (tying it to the embedding), and filling never picks the mask symbol.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.data.corpus import IGNORE, RandomWindows
from charlm.data.prepare import release_mapped_pages
from charlm.hardware.device import autocast
from charlm.models.decoder import absolute_positions, init_weights, recorded_attention
from charlm.models.encoder_decoder import EncoderBlock
from charlm.models.layers import TokenShift, make_norm
from charlm.models.linear import Linear

MASK_RATE, MASK_SYMBOL, MASK_RANDOM = 0.15, 0.8, 0.1  # of the chosen positions: 80% mask, 10% random, 10% kept
EVAL_SEED = 0  # evaluations hide the same positions every time: a low-noise signal, as fixed windows are


class EncoderOnly(nn.Module):
    """Token embedding (+ absolute positions), bidirectional blocks, a final norm (pre-LN), and the head."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__()
        self.config, self.vocab_size, self.mask_id = config, vocab_size, vocab_size
        C = config.n_embd
        self.tok_emb = nn.Embedding(vocab_size + 1, C)  # + the mask symbol
        self.pos_emb = absolute_positions(config)
        self.token_shift = TokenShift(C) if config.token_shift else None
        self.embed_scale = math.sqrt(C) if config.pos_encoding == "sinusoidal" else 1.0
        self.drop = nn.Dropout(config.dropout)
        self.encoder = nn.ModuleList(EncoderBlock(config) for _ in range(config.n_layer))
        self.ln_f = make_norm(config) if config.norm_position == "pre" else nn.Identity()
        self.head = Linear(C, vocab_size + 1, bias=config.head_bias)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    relative_positions = False

    def _init_weights(self, module: nn.Module) -> None:
        init_weights(module, self.config, self.config.n_layer)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V + 1) of every position; with targets (IGNORE where not hidden) the mean cross-entropy."""
        B, T = idx.shape
        if self.config.block_size < T:
            raise ValueError(f"sequence of length {T} is longer than the model's block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.tok_emb(idx) * self.embed_scale if self.embed_scale != 1.0 else self.tok_emb(idx)  # (B, T, C)
        if self.token_shift is not None:
            x = self.token_shift(x)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        x = self.drop(x)
        everything = torch.ones(B, T, dtype=torch.bool, device=idx.device)  # no padding: every key may be seen
        for block in self.block_list:
            x = block(x, everything, pos)
        logits = self.head(self.ln_f(x))  # (B, T, V + 1)
        if self.config.logit_softcap:  # smooth cap: c * tanh(z / c), as GPT's
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits / c)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE)
        return logits, loss

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """Every layer's weights (n_layer, B, n_head, T, T): full, not triangular."""
        return torch.stack(recorded_attention([block.attn for block in self.block_list], lambda: self(idx)))

    @property
    def block_list(self) -> list[EncoderBlock]:
        return cast("list[EncoderBlock]", list(self.encoder))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


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


@dataclass
class MaskedResult:
    """`charlm eval` for an encoder: how well it restores hidden characters."""

    loss: float  # nats per hidden character
    accuracy: float  # fraction of hidden characters restored exactly (the top candidate)
    chars: int  # hidden characters scored
    split: str = "val"
    file: str = ""

    @property
    def bpc(self) -> float:
        return self.loss / math.log(2)

    def to_dict(self) -> dict:
        return {**asdict(self), "bpc": self.bpc}


@torch.no_grad()
def masked_score(
    model: EncoderOnly,
    ids: torch.Tensor,
    starts: torch.Tensor,
    device: torch.device,
    batch_size: int = 64,
    amp_dtype: torch.dtype | None = None,
) -> tuple[float, int, int]:
    """Summed loss, characters restored and characters hidden over windows at `starts`. Each window is hidden by a
    generator seeded from EVAL_SEED and its own start, so a window looks the same whichever batch or rank scores it."""
    generator = torch.Generator()
    offsets = torch.arange(model.config.block_size)
    was_training = model.training
    model.eval()
    total, right, count = 0.0, 0, 0
    for i in range(0, len(starts), batch_size):
        hidden_windows = []
        for start in starts[i : i + batch_size].tolist():
            generator.manual_seed(EVAL_SEED * 1_000_003 + start)
            hidden_windows.append(hide(ids[start + offsets].long()[None], model.vocab_size, generator))
        inputs = torch.cat([w[0] for w in hidden_windows])
        targets = torch.cat([w[1] for w in hidden_windows])
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast(device, amp_dtype):
            logits, loss = model(inputs, targets)
        hidden = targets != IGNORE
        n = int(hidden.sum())
        total += float(loss) * n
        right += int((logits[..., : model.vocab_size].argmax(-1) == targets)[hidden].sum())
        count += n
    model.train(was_training)
    return total, right, count


def all_windows(ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Starts of the non-overlapping whole windows of a split (what `charlm eval` scores)."""
    return torch.arange(0, len(ids) - block_size + 1, block_size)


@dataclass
class Blank:
    position: int
    candidates: list[tuple[str, float]]  # the most likely characters and their probabilities


@torch.no_grad()
def fill(model: EncoderOnly, ids: list[int], blanks: list[int], top: int) -> list[list[tuple[int, float]]]:
    """Every blank's top candidates (id, probability), all blanks predicted at once from one forward pass."""
    model.eval()
    device = next(model.parameters()).device
    inputs = torch.tensor([ids], device=device)
    inputs[0, blanks] = model.mask_id
    logits = model(inputs)[0][0, blanks, : model.vocab_size].float()  # (blanks, V): never the mask symbol
    probs = torch.softmax(logits, dim=-1)
    values, indices = probs.topk(min(top, model.vocab_size), dim=-1)
    return [list(zip(i.tolist(), v.tolist(), strict=True)) for v, i in zip(values, indices, strict=True)]
