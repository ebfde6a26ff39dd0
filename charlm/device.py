"""Choosing the device, the autocast precision and whether to compile."""

from __future__ import annotations

import contextlib
import random

import torch

from charlm.config import DEVICE_NAMES, valid_device_name
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


def autocast_dtype(device: torch.device, requested: str) -> torch.dtype | None:
    """None means plain float32. `auto` uses bf16 on CUDA where supported, else fp16; float32 elsewhere."""
    if requested == "float32":
        return None
    if requested == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if requested == "float16" and device.type == "cpu":
        raise UsageError("train.dtype float16 is for GPUs; on the CPU use bfloat16 or float32")
    return getattr(torch, requested)


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def should_compile(device: torch.device, requested: str) -> bool:
    """`auto` compiles on CUDA only: on CPU, torch.compile measured no faster here and costs ~30 s up front."""
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
