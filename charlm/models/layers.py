"""The interchangeable pieces from the classic Transformer texts (positional encodings, norms, feed-forwards) and
the speedrun era's token shift."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.models.kvcache import Cache
from charlm.models.linear import Linear

# ---------------------------------------------------------------------------- positional encodings


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); shape (length, dim)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    two_i = torch.arange(0, dim, 2, dtype=torch.float32)  # (d/2,)
    angles = pos / torch.pow(10000.0, two_i / dim)  # (L, d/2)
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table


class SinusoidalPositions(nn.Module):
    """The original paper's fixed encoding, added to the token embeddings; no parameters."""

    table: torch.Tensor

    def __init__(self, block_size: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(block_size, dim), persistent=False)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return self.table[pos]  # (T, C)


class ResidualProjection(Linear):
    """A Linear layer that writes into the residual stream (W_O, the feed-forward's output): GPT-2 starts these
    scaled down by 1/sqrt(2 * n_layer), so the stream's variance does not grow with depth."""


Rotation = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # cos, sin, and cos + i sin (the complex path)


class Rotary(nn.Module):
    """RoPE: rotate each (even, odd) pair of query/key features by an angle proportional to the position.

    Attention scores then depend only on relative positions, for any position (no table to outgrow).
    """

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # The last positions' rotation: queries and keys, and every layer sharing this module, rotate by the same
        # angles in one forward pass; recomputing them was a large share of a decoding step (docs/benchmarks.md).
        self.last: tuple[torch.Tensor, tuple[torch.dtype, int], Rotation] | None = None

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x: (B, nh, T, hd), pos: (T,) absolute positions, or (B, T) when each row has its own."""
        cos, sin, turn = self.rotation(pos, x.dtype, x.device)
        if turn is not None:
            # Each (even, odd) pair as one complex number turned by cos + i sin: one kernel forward and backward,
            # much faster on the CPU than the four products below (the same rotation, to a rounding).
            pairs = torch.view_as_complex((x if _pairs_view_ok(x) else x.contiguous()).unflatten(-1, (-1, 2)))
            return torch.view_as_real(pairs * turn).flatten(-2)  # (B, nh, T, hd)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def rotation(self, pos: torch.Tensor, dtype: torch.dtype, device: torch.device) -> Rotation:
        """cos and sin of the angles, (T, hd/2) or (B, 1, T, hd/2), and cos + i sin where the complex path runs
        (float32 on the CPU, not under torch.compile, which traces this); reused while the same `pos` tensor comes
        back unchanged (it is held, so its identity cannot pass to another tensor)."""
        compiling = torch.compiler.is_compiling()  # traced: no memo (a compiled step computes them once anyway)
        key = (dtype, 0 if compiling else _version(pos))
        if not compiling and self.last is not None and self.last[0] is pos and self.last[1] == key:
            return self.last[2]
        angles = pos.to(self.inv_freq.dtype)[..., None] * self.inv_freq  # (T, hd/2) or (B, T, hd/2)
        if angles.dim() == 3:
            angles = angles[:, None]  # (B, 1, T, hd/2): the same angle for every head
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        complex_path = dtype == torch.float32 and device.type == "cpu" and not compiling
        rotation = (cos, sin, torch.complex(cos, sin) if complex_path else None)
        if not compiling:
            self.last = (pos, key, rotation)
        return rotation


def _version(t: torch.Tensor) -> int:
    """How many times t was changed in place; tensors made under torch.inference_mode keep no count (0): decoding
    makes its positions anew each step and never changes them."""
    return 0 if t.is_inference() else t._version


def _pairs_view_ok(x: torch.Tensor) -> bool:
    """Whether x's (even, odd) feature pairs can be viewed as complex numbers without a copy."""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Per-head slopes 2^(-8/n), 2^(-16/n), ... (Press et al.), with the paper's rule for non-powers of two."""

    def powers(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        return torch.tensor(powers(n_head))
    closest = 2 ** math.floor(math.log2(n_head))
    return torch.tensor(powers(closest) + powers(2 * closest)[0::2][: n_head - closest])


def part_bias(config: ModelConfig, part: str) -> bool:
    """Whether a part's Linear layers have biases: model.<part>_bias if set, else model.bias."""
    own = getattr(config, f"{part}_bias")
    return config.bias if own is None else own


# ---------------------------------------------------------------------------- token shift


class TokenShift(nn.Module):
    """Each position's input takes in its predecessor's: x_t + sigmoid(x_t · g) (m ⊙ x_{t-1}) (RWKV's token shift,
    nanochat's smear), at the embeddings and at every layer's self-attention input: what attention would otherwise
    spend a head on fetching, the previous character, comes for the price of an elementwise product.

    m starts at zero, so a model starts without it; the gate g lets each position choose how much of its predecessor
    it takes. A text's first position has none (zeros); while decoding, the cache gives the predecessor of a step's
    first position (its shift point `point`: 0 the embeddings, 1 + l layer l's attention input).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.mix = nn.Parameter(torch.zeros(dim))  # m: how much of each channel of x_{t-1}
        self.gate = nn.Parameter(torch.zeros(dim))  # g: sigmoid(0) = 1/2 at first, for every character

    def forward(self, x: torch.Tensor, cache: Cache | None = None, point: int = 0) -> torch.Tensor:
        """x (B, T, C) shifted. Few operations: a decoding step runs this at every shift point for each character,
        where each operation's dispatch costs more than its arithmetic."""
        previous = predecessors(x) if cache is None else cache.predecessors(x, point)  # (B, T, C)
        gate = torch.sigmoid(F.linear(x, self.gate[None]))  # (B, T, 1)
        return torch.addcmul(x, gate, self.mix * previous)


def predecessors(x: torch.Tensor) -> torch.Tensor:
    """(B, T, C): x moved one position on, zeros before the first position (a text's, or a window's start)."""
    return F.pad(x[:, :-1], (0, 0, 1, 0))


# ---------------------------------------------------------------------------- norms


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


# ---------------------------------------------------------------------------- feed-forward


def ffn_hidden(config: ModelConfig) -> int:
    """Hidden width: ffn_mult x d; for SwiGLU two thirds of that, so its three matrices hold as many weights as two."""
    hidden = config.ffn_mult * config.n_embd
    return round(2 * hidden / 3) if config.activation == "swiglu" else round(hidden)


# ---------------------------------------------------------------------------- dropout

MASK_LEVELS = 65536  # a CPU mask's resolution: its drop probability is model.dropout rounded to a multiple of 1/65536


class Dropout(nn.Dropout):
    """nn.Dropout whose training mask, on the CPU, is 16-bit integers, four from each 64-bit random number: torch's
    CPU dropout draws a float an element (bernoulli_), a tenth of the training step of `--budget 10m`'s 5 x 128
    model, and this mask costs a half to a third of that (scripts/bench_dropout.py). Kept values are scaled by
    1 / (1 - the rounded p), so in float32 their expectation is kept exactly (in bfloat16 the scale is rounded, as in
    torch's own dropout). In eval mode, off the CPU and under torch.compile it is nn.Dropout; dropout of attention
    weights inside SDPA (model.attention_dropout) is SDPA's own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dropped = round(self.p * MASK_LEVELS)
        cpu_eager = x.device.type == "cpu" and not torch.compiler.is_compiling()  # inductor fuses its own mask
        if not (self.training and 0 < dropped < MASK_LEVELS and cpu_eager) or self.inplace:
            return super().forward(x)
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits random
        draws = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform over -32768..32767
        keep = (draws >= dropped - MASK_LEVELS // 2).to(x.dtype)  # 1 with probability 1 - dropped / MASK_LEVELS
        return x * keep.mul_(MASK_LEVELS / (MASK_LEVELS - dropped))


class MLP(nn.Module):
    """Position-wise feed-forward: d -> hidden -> d with ReLU, ReLU² or GELU, or SwiGLU (silu(xW1) * xW3) W2."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden = ffn_hidden(config)
        self.activation = config.activation
        gates = 2 if config.activation == "swiglu" else 1
        self.fc = Linear(config.n_embd, gates * hidden, bias=part_bias(config, "ffn"))
        self.proj = ResidualProjection(hidden, config.n_embd, bias=part_bias(config, "ffn"))
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.activation == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        elif self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "relu2":
            h = F.relu(h).square()
        else:
            h = F.gelu(h)
        return self.dropout(self.proj(h))


class MixtureOfExperts(nn.Module):
    """model.n_experts feed-forwards; a linear router sends each token to its top-k experts, whose outputs are
    summed with the router's probabilities renormalised over those k. Only k experts run per token.

    `aux_loss` holds the last forward's load-balancing loss (Switch Transformer): E · Σ_e f_e · P_e, where f_e is the
    share of routing slots that went to expert e and P_e its mean router probability; 1.0 when perfectly balanced.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.k = config.expert_top_k
        self.router = Linear(config.n_embd, config.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(config) for _ in range(config.n_experts))
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        flat = x.reshape(-1, C)  # (N, C)
        probs = torch.softmax(self.router(flat).float(), dim=-1)  # (N, E)
        top_p, top_i = probs.topk(self.k, dim=-1)  # (N, k)
        top_p = (top_p / top_p.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (top_i == e).nonzero(as_tuple=True)  # the tokens routed to expert e
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * top_p[rows, slot, None])
        share = F.one_hot(top_i, len(self.experts)).float().mean(dim=(0, 1))  # (E,) f_e
        self.aux_loss = len(self.experts) * (share * probs.mean(0)).sum()
        return out.view(B, T, C)


def feed_forward(config: ModelConfig) -> nn.Module:
    return MixtureOfExperts(config) if config.n_experts else MLP(config)
