"""Decoding precision: a trained model's Linear weights as int8 for faster CPU decoding (`--precision int8`).

Decoding one character at a time reads every weight once per step, so a big model's step is bound by memory, not
arithmetic: 6 layers x 384 wide hold 43 MB in float32, more than many CPUs' last-level cache. Stored as int8 with
one scale per output row (weight-only, symmetric), the same weights take a quarter of that and run through
torch's int8 weight-only kernel (the one gpt-fast decodes with); activations, norms, attention and the KV cache
stay float32, and each matrix product's input is rounded to bfloat16, which that kernel takes.

float32 is the default and gives exactly the text it always did for a seed; int8 is opt-in: its next-character
choices agree with float32's on nearly every step (scripts/bench_sample.py measures the agreement on a checkpoint;
figures in docs/benchmarks.md), but not on every one, so a seed's text can differ after a while.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from charlm.errors import UsageError
from charlm.models.layers import MixtureOfExperts

PRECISIONS = ("float32", "int8")
AnyModule = TypeVar("AnyModule", bound=nn.Module)


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 rows times a per-row scale: W ≈ q * scale, |q| <= 127."""

    qweight: torch.Tensor  # (out, in) int8
    scale: torch.Tensor  # (out,) bfloat16

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()  # (out, in)
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,): the row's largest weight maps to 127
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (N, in): the kernel's input type
        y = torch._weight_int8pack_mm(flat, self.qweight, self.scale).to(x.dtype)  # (N, out)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def quantize_linears(module: nn.Module, keep: tuple[nn.Module, ...] = ()) -> int:
    """Replace every nn.Linear inside `module` but those in `keep` by an Int8Linear, in place; how many were replaced.

    A Linear whose input width is not a multiple of 16 stays float32: torch's AVX-512 int8 kernel reads its input in
    blocks of 16 and crashes on other widths (its AVX2 and plain kernels take any; docs/benchmarks.md names the
    version)."""
    replaced = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Linear) and child.in_features % 16 == 0 and not any(child is k for k in keep):
            setattr(module, name, Int8Linear(child))
            replaced += 1
        else:
            replaced += quantize_linears(child, keep)
    return replaced


def for_decoding(module: AnyModule, precision: str) -> AnyModule:
    """The model in the precision asked for decoding: float32 as it is, int8 quantized in place (CPU only).

    The output head stays float32: it is small (vocabulary x width), so int8 would save little reading, and its
    rounding lands directly on the logits that rank the next character (quantizing it lowers the next-character
    agreement with float32 on a 4 x 96 model: docs/benchmarks.md). A mixture's routers stay
    float32 for the same reason: they rank experts as the head ranks characters."""
    if precision not in PRECISIONS:
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "float32":
        return module
    device = next(module.parameters()).device
    if device.type != "cpu":
        raise UsageError(
            f"--precision int8 decodes on the CPU (torch's int8 weight-only kernel); the model is on {device}: "
            "add --device cpu, or leave out --precision on a GPU"
        )
    head = getattr(module, "head", None)
    routers = tuple(m.router for m in module.modules() if isinstance(m, MixtureOfExperts))  # pick experts: as the head
    if not quantize_linears(module, keep=routers + ((head,) if isinstance(head, nn.Module) else ())):
        raise UsageError(
            "--precision int8 has nothing to quantize in this model: its layers' input widths are not multiples of "
            "16 (torch's int8 kernel needs them); decode it in float32"
        )
    return module
