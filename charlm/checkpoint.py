"""Self-contained checkpoints: written atomically, read with torch.load(weights_only=True), checked before use."""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm import __version__
from charlm.config import Config, config_from_dict
from charlm.errors import UsageError
from charlm.files import atomic_write
from charlm.model import GPT
from charlm.tokenizer import CharTokenizer

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format_version", "config", "vocab", "model", "step")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    state = {"format_version": FORMAT_VERSION, "charlm_version": __version__, **state}
    atomic_write(path, lambda f: torch.save(state, f))


@dataclass
class Checkpoint:
    path: Path
    config: Config
    tokenizer: CharTokenizer
    state: dict[str, Any]  # everything stored, as loaded

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def build_model(self, device: torch.device | str = "cpu") -> GPT:
        """The model with its weights, refusing weights that do not fit the recorded shapes or are not finite."""
        model = GPT(self.config.model, self.tokenizer.vocab_size)
        weights = self.state["model"]
        if not isinstance(weights, dict):
            raise UsageError(f"checkpoint {self.path} is damaged: its model weights are not a state dict")
        bad = [k for k, t in weights.items() if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all()]
        if bad:
            raise UsageError(f"checkpoint {self.path} holds non-finite weights (in {bad[0]}); use an earlier checkpoint")
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as e:
            first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
            raise UsageError(f"checkpoint {self.path} does not match its recorded model shape: {first}") from None
        return model.to(device)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read and check a checkpoint; every problem becomes one UsageError line, never a partial load."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"checkpoint not found: {path} (train one with `charlm train`, or check the path)")
    if path.is_dir():
        raise UsageError(f"checkpoint path is a directory: {path} (give a .pt file, e.g. {path / 'best.pt'})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # The weights-only unpickler names the global it refused (e.g. posix.system) when a file asks for code.
        reason = "it is truncated, damaged or not a charlm checkpoint"
        if "GLOBAL" in str(e):
            reason = "it holds objects other than tensors and plain data (refused: loading it could run code)"
        raise UsageError(f"cannot load checkpoint {path}: {reason}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, AttributeError, KeyError) as e:
        raise UsageError(f"cannot load checkpoint {path}: it is truncated, damaged or not a charlm checkpoint") from e
    return _check(path, state)


def _check(path: Path, state: Any) -> Checkpoint:
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise UsageError(f"{path} is not a charlm checkpoint (missing {', '.join(k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state)})")
    version = state["format_version"]
    if version != FORMAT_VERSION:
        raise UsageError(
            f"checkpoint {path} has format_version {version!r}, but this charlm (v{__version__}) reads version "
            f"{FORMAT_VERSION}; use the charlm version that wrote it"
        )
    if not isinstance(state["config"], dict) or not isinstance(state["vocab"], list):
        raise UsageError(f"checkpoint {path} is damaged: its config or vocabulary is malformed")
    try:
        config = config_from_dict(state["config"], f"checkpoint {path}")
    except UsageError as e:
        raise UsageError(f"checkpoint {path} holds an invalid config: {e}") from None
    tokenizer = CharTokenizer(state["vocab"])
    return Checkpoint(path, config, tokenizer, state)
