"""Linear layers whose float32 products on the CPU can go through oneDNN's kernels instead of torch's default BLAS.

Why: torch's x86 CPU build multiplies float32 matrices with MKL's sgemm, which takes a slow path on AMD CPUs;
oneDNN (also inside torch) computes the same float32 products, with no lower precision, only another order of
summation, faster there (docs/benchmarks.md, over a whole training step). `train.cpu_linear` chooses; the training
header says which kernels ran.
"""

from __future__ import annotations

import contextlib
import functools
import platform
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from charlm.errors import UsageError

_onednn_on: ContextVar[bool] = ContextVar("charlm_onednn_linears", default=False)


@contextlib.contextmanager
def onednn_linears(on: bool) -> Iterator[None]:
    """Inside, every charlm Linear with float32 CPU tensors multiplies through oneDNN (when `on`)."""
    token = _onednn_on.set(on)
    try:
        yield
    finally:
        _onednn_on.reset(token)


def _pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weightᵀ + bias by oneDNN: x (N, in), weight (out, in), any strides; float32 throughout."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDNNLinearFunction(torch.autograd.Function):
    """y = x Wᵀ + b with oneDNN's float32 kernels forwards and backwards (the three products of a linear layer)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.size(-1))  # (N, in)
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return _pointwise(x2, weight, bias).view(*x.shape[:-1], weight.size(0))  # (..., out)

    @staticmethod
    @torch.autograd.function.once_differentiable  # oneDNN's op has no derivative of its own: no double backward
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.size(-1))  # (N, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _pointwise(g2, weight.t()).view(*grad.shape[:-1], weight.size(1))  # (N, out) @ (out, in)
        if ctx.needs_input_grad[1]:
            # gᵀ x (out, in): oneDNN copies a transposed first operand, so the narrower of the two goes first
            out_features, in_features = weight.shape
            if in_features <= out_features:
                grad_w = _pointwise(x2.t(), g2.t()).t()  # ((in, N) @ (N, out))ᵀ
            else:
                grad_w = _pointwise(g2.t(), x2.t())  # (out, N) @ (N, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


class Linear(nn.Linear):
    """nn.Linear whose float32 CPU products go through oneDNN inside `onednn_linears(True)`; torch's own kernel
    otherwise: under autocast (bf16 stays autocast's), on a GPU, and while torch.compile traces."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            not torch.compiler.is_compiling()  # first: a compiled graph must not read the switch (a graph break)
            and _onednn_on.get()
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and x.device.type == "cpu"
            and x.numel() > 0
            and not torch.is_autocast_enabled("cpu")
        ):
            return OneDNNLinearFunction.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


@functools.cache
def onednn_problem() -> str | None:
    """Why oneDNN's linear kernel cannot be used here, or None when it can."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"oneDNN's linear kernel is used on x86-64 CPUs only (this is {platform.machine()})"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build has no oneDNN linear kernel"
    return None


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor string (GenuineIntel, AuthenticAMD, ...), or "" where /proc/cpuinfo is not readable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def use_onednn(device: torch.device, requested: str) -> bool:
    """train.cpu_linear: `auto` takes oneDNN on x86-64 CPUs known not to be Intel's (where MKL is at its best and the
    gain was not measured; an unreadable vendor counts as Intel's); `onednn` insists (refused in one line where it
    cannot run); `torch` never."""
    if device.type != "cpu" or requested == "torch":
        return False
    problem = onednn_problem()
    if requested == "onednn":
        if problem:
            raise UsageError(f"train.cpu_linear=onednn: {problem}; use train.cpu_linear=auto or torch")
        return True
    return problem is None and cpu_vendor() not in ("", "GenuineIntel")


def linear_words(on: bool, requested: str, compiled: bool = False) -> str:
    """What a float32 CPU run's header says of its linear layers' kernels."""
    if compiled:
        return "torch.compile's (train.cpu_linear applies to runs without train.compile)"
    if on:
        how = "train.cpu_linear=torch for torch's default" if requested == "auto" else "train.cpu_linear=onednn"
        return f"oneDNN float32 kernels ({how})"
    if requested == "torch":
        return "torch's default float32 kernels (train.cpu_linear=torch)"
    why = onednn_problem() or "MKL is at its best on Intel CPUs; train.cpu_linear=onednn forces oneDNN"
    return f"torch's default float32 kernels ({why})"
