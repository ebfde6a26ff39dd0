"""Choosing the device, the autocast precision and whether to compile."""

from __future__ import annotations

import contextlib
import functools
import random

import torch

from charlm.config.checks import DEVICE_NAMES, valid_device_name
from charlm.errors import UsageError

MIN_TORCH = (2, 6)  # torch.load(weights_only=True) is safe from 2.6 on


def require_torch(version: str = torch.__version__) -> None:
    """Refuse a torch too old to load checkpoints safely."""
    parts = version.split("+")[0].split(".")
    found = tuple(int(p) if p.isdigit() else 0 for p in parts[:2])
    if found < MIN_TORCH:
        raise UsageError(
            f"charlm needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} for safe checkpoint loading, found {version}; "
            "upgrade with `pip install -U torch`"
        )


def pick_device(name: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit device must exist here."""
    if not valid_device_name(name):
        raise UsageError(f"not a device charlm knows: {name!r} (use {DEVICE_NAMES})")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(
                f"device {name!r} asked for, but this torch build sees no CUDA GPU (use --device cpu or auto)"
            )
        if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
            raise UsageError(f"device {name!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UsageError("device 'mps' asked for, but MPS is not available here (use --device cpu or auto)")
    return torch.device(name)


def autocast_dtype(
    device: torch.device, requested: str, width: int = 0, tokens: int = 0, onednn: bool = False
) -> torch.dtype | None:
    """None means plain float32. `auto`: bf16 on CUDA where supported, else fp16; on a CPU with bf16 matrix units
    (AMX-BF16 or AVX-512 BF16), bf16 when a model `width` wide on micro-batches of `tokens` is big enough to gain
    over float32 (on oneDNN's kernels when `onednn`: cpu_bf16_pays); float32 elsewhere."""
    if requested == "float32":
        return None
    if requested == "auto":
        if device.type == "cpu":
            units = cpu_bf16_units()
            return torch.bfloat16 if units and cpu_bf16_pays(width, tokens, units, onednn) else None
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if requested == "float16" and device.type == "cpu":
        raise UsageError("train.dtype float16 is for GPUs; on the CPU use bfloat16 or float32")
    return getattr(torch, requested)


@functools.cache
def cpu_bf16_units() -> str | None:
    """How this CPU multiplies bf16 matrices: "amx" (AMX-BF16 tiles: Intel Xeon since Sapphire Rapids), "avx512"
    (AVX-512 BF16 dot products: AMD EPYC since Zen 4, some Intel), or None (no native bf16: float32)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = set(f.read().split())
    except OSError:  # not Linux: no run-time check, float32
        return None
    return "amx" if "amx_bf16" in flags else "avx512" if "avx512_bf16" in flags else None


def cpu_bf16_pays(width: int, tokens: int, units: str = "amx", onednn: bool = False) -> bool:
    """Where bf16 autocast trained clearly faster than float32 (scripts/bench_bf16.py's maps; the figures are in
    docs/benchmarks.md). AMX: from 384 wide, where both AMX maps gained (1.00-1.78x); below it one map lost up to
    1.3x where the other gained (the G2P recipes 1.2-1.75x slower). AVX-512 BF16: from 192 wide at any batch, from
    128 wide from 0.5M token-features (batch x context x width); never at 96 wide. Against float32 on oneDNN's
    kernels (`onednn`, train.cpu_linear), AVX-512 BF16 pays only from 384 wide."""
    if units == "avx512" and onednn:
        return width >= 384
    if units == "avx512":
        return width >= 192 or (width >= 128 and width * tokens >= 500_000)
    return width >= 384


def precision_name(dtype: torch.dtype | None) -> str:
    return "float32" if dtype is None else str(dtype).removeprefix("torch.")


def precision_words(dtype: torch.dtype | None, requested: str, device: torch.device) -> str:
    """What a run's header says of its precision, and why when train.dtype was auto on a CPU."""
    name = "float32" if dtype is None else f"{precision_name(dtype)} autocast"
    if requested != "auto" or device.type != "cpu":
        return name
    units = {"amx": "AMX-BF16", "avx512": "AVX-512 BF16"}.get(cpu_bf16_units() or "")
    if dtype is not None:
        return f"{name} (this CPU has {units} and the model is wide enough to gain; train.dtype=float32 turns it off)"
    if units:
        return f"{name} ({units} would not pay at this model's size; train.dtype=bfloat16 forces it)"
    return f"{name} (no native bf16 on this CPU)"


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def should_compile(device: torch.device, requested: str) -> bool:
    """`auto` compiles on CUDA only: on CPU a compiled training step is no faster and costs seconds of compiling up
    front (docs/benchmarks.md)."""
    if requested == "auto":
        return device.type == "cuda"
    return requested == "true"


def configure_backends(device: torch.device) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def out_of_memory(error: BaseException) -> bool:
    """An allocation the device could not make: CUDA's OutOfMemoryError, or a RuntimeError saying so (the CPU
    allocator's, a CUDA kernel's or library's, MPS's)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    said = str(error)
    return isinstance(error, RuntimeError) and any(
        words in said for words in ("can't allocate memory", "CUDA error: out of memory", "MPS backend out of memory")
    )
