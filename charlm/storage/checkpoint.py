"""Self-contained checkpoints: what they hold, written atomically, read with torch.load(weights_only=True), checked.

A checkpoint is a dict of tensors and plain data: the resolved config, the vocabulary, the model's weights (the
unwrapped model: no DDP or torch.compile prefixes) and, for `--resume`, the loop's RunState (storage.run_state) saved
whole beside the RESUME_PARTS: the optimizer's, schedule's and GradScaler's states, every rank's random streams and
the weight average of train.ema_decay.
"""

from __future__ import annotations

import copy
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm.config.build import config_from_dict
from charlm.config.schema import Config
from charlm.data.tokenizer import Tokenizer, make_tokenizer
from charlm.errors import UsageError
from charlm.families.registry import AnyModel, build_model
from charlm.files import atomic_write
from charlm.storage.run_state import RunState
from charlm.version import __version__

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format_version", "config", "vocab", "model", "step")
RUNS_DIR = Path("runs")  # where `charlm train` puts run folders by default (relative to the working folder)
# What an exact resume needs beyond the weights and the RunState: {"optimizer", "scheduler" (charlm.training.schedule),
# "scaler" (the fp16 GradScaler's, or None), "ranks" (every rank's {"rng": ..., "sampler": ...}), "average"
# (train.ema_decay's weight average, charlm.training.averaging, or None: checkpoints from before it have none)}.
RESUME_PARTS = ("optimizer", "scheduler", "scaler", "ranks", "average")
OPTIONAL_PARTS = ("average",)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Tensors are saved from the CPU whatever device trained them, so a checkpoint written on a GPU opens with a
    plain torch.load on a machine without one (torch.save copies them to the host either way)."""
    state = on_cpu({"format_version": FORMAT_VERSION, "charlm_version": __version__, **state})
    atomic_write(path, lambda f: torch.save(state, f))


def on_cpu(value: Any, copies: dict[tuple, torch.Tensor] | None = None) -> Any:
    """value with every tensor inside its dicts, lists and tuples on the CPU. What is on the CPU already is returned
    as it is (a CPU run's state is saved untouched); a container with a moved tensor is copied shallowly, keeping its
    type (a state_dict's OrderedDict keeps its _metadata); views of one GPU tensor (a tied embedding and head) stay one
    CPU tensor, so torch.save stores it once."""
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), value.shape, value.stride(), value.dtype)
        if key not in copies:
            copies[key] = value.cpu()
        return copies[key]
    if isinstance(value, dict):
        moved = {key: on_cpu(item, copies) for key, item in value.items()}
        if all(moved[key] is item for key, item in value.items()):
            return value
        result = copy.copy(value)
        result.update(moved)
        return result
    if isinstance(value, (list, tuple)):
        items = [on_cpu(item, copies) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def save_training_checkpoint(
    path: Path,
    config: Config,
    tokenizer: Tokenizer,
    model: torch.nn.Module,
    state: RunState,
    parts: dict[str, Any],
) -> None:
    """A checkpoint that sample, eval and info read, and that `charlm train --resume` continues exactly."""
    assert set(parts) == set(RESUME_PARTS), f"resume parts {sorted(parts)}"  # a programming error, not user input
    weights = {"config": config.to_dict(), "vocab": tokenizer.chars, "model": model.state_dict()}
    if tokenizer.features is not None:  # a features column: the features' names, in their symbols' order
        weights["features"] = tokenizer.features.model_tags()
    save_checkpoint(path, {**weights, **state.to_dict(), **parts})


@dataclass
class Checkpoint:
    path: Path
    config: Config
    tokenizer: Tokenizer
    state: dict[str, Any]  # everything stored, as loaded

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def resume_state(self) -> tuple[RunState, dict[str, Any]]:
        """The loop's state and the RESUME_PARTS, or one line saying why this checkpoint cannot be resumed."""
        parts = [name for name in RESUME_PARTS if name not in OPTIONAL_PARTS]
        needed = ("best_val_loss", "world_size", "global_batch", *parts)
        missing = [name for name in needed if name not in self.state]
        if missing:
            raise UsageError(
                f"checkpoint {self.path} lacks a usable training state (no {', '.join(missing)}); it cannot be resumed"
            )
        try:
            state = RunState.from_dict(self.state)
        except (TypeError, ValueError) as e:
            why = f"lacks a usable training state ({e})"
            raise UsageError(f"checkpoint {self.path} {why}; it cannot be resumed") from None
        return state, {name: self.state.get(name) for name in RESUME_PARTS}

    def build_model(self, device: torch.device | str = "cpu") -> AnyModel:
        """The model with its weights, refusing weights that do not fit the recorded shapes or are not finite."""
        model = build_model(self.config.model, self.tokenizer.vocab_size)
        weights = self.state["model"]
        if not isinstance(weights, dict):
            raise UsageError(f"checkpoint {self.path} is damaged: its model weights are not a state dict")
        bad = [
            k
            for k, t in weights.items()
            if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all()
        ]
        if bad:
            raise UsageError(
                f"checkpoint {self.path} holds non-finite weights (in {bad[0]}); use an earlier checkpoint"
            )
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as e:
            first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
            raise UsageError(f"checkpoint {self.path} does not match its recorded model shape: {first}") from None
        return model.to(device)


def run_checkpoints(runs_dir: Path = RUNS_DIR) -> list[Path]:
    """Every runs_dir/*/best.pt. One level down only: a sweep's trials (runs/SWEEP/trial-NNN/) are candidates of a
    search, never picked unasked."""
    return [p for p in runs_dir.glob("*/best.pt") if p.is_file()] if runs_dir.is_dir() else []


def newest_checkpoint(runs_dir: Path = RUNS_DIR) -> Path:
    """The most recently written of run_checkpoints: what `charlm sample` and `eval` use when given none."""
    found = run_checkpoints(runs_dir)
    if not found:
        raise UsageError(
            f"no checkpoint given and none found under {runs_dir}/*/: train one with `charlm train`, "
            "or pass a checkpoint file or run folder (e.g. runs/cpu/best.pt; a sweep's trial: runs/SWEEP/trial-000)"
        )
    return max(found, key=lambda p: p.stat().st_mtime)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read and check a checkpoint file; every problem is one UsageError line. (A run folder or an export: see
    charlm.storage.loading, the one place that tells the kinds apart.)"""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a folder, not a checkpoint file (give its best.pt or last.pt)")
    if not path.exists():
        raise UsageError(f"checkpoint not found: {path} (train one with `charlm train`, or check the path)")
    try:
        with warnings.catch_warnings():  # torch warns about a plain pickle's protocol before refusing it
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # The weights-only unpickler names the global it refused (e.g. posix.system) when a file asks for code.
        reason = "it is truncated, damaged or not a charlm checkpoint"
        if "GLOBAL" in str(e):
            reason = "it holds objects other than tensors and plain data (refused: loading it could run code)"
        raise UsageError(f"cannot load checkpoint {path}: {reason}") from None
    except MemoryError:
        raise
    except Exception as e:  # the unpickler raises many types on other bytes (IndexError on a text file)
        raise UsageError(f"cannot load checkpoint {path}: it is truncated, damaged or not a charlm checkpoint") from e
    return _check(path, state)


def _check(path: Path, state: Any) -> Checkpoint:
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UsageError(f"{path} is not a charlm checkpoint (missing {', '.join(missing)})")
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
    try:
        tokenizer = make_tokenizer(
            config.data.tokenizer,
            state["vocab"],
            state.get("features"),
            config.data.feature_separator,
            config.data.columns,
        )
    except UsageError as e:
        raise UsageError(f"checkpoint {path} is damaged: {e}") from None
    return Checkpoint(path, config, tokenizer, state)
