"""A run's folder: refusing to clobber one, making it, and writing its checkpoints with config.yaml beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from charlm.config.schema import Config
from charlm.data.tokenizer import Tokenizer
from charlm.errors import SaveFailed, UsageError
from charlm.files import atomic_write, remove_stale_temps
from charlm.storage.checkpoint import save_training_checkpoint
from charlm.storage.run_state import RunState

RUN_FILES = (
    "last.pt", "best.pt", "metrics.jsonl", "config.yaml", "budget.json", "steps.jsonl", "summary.json", "metrics.csv"
)  # fmt: skip


def check_out_dir(out_dir: Path, resume: bool, overwrite: bool) -> list[str]:
    """Refuse to clobber a run by accident (nothing is written here). Returns the run files already there."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir} is a file, not a folder; choose another --out-dir")
    existing = [name for name in RUN_FILES if (out_dir / name).exists()]
    if resume:
        if not (out_dir / "last.pt").exists():
            raise UsageError(f"nothing to resume: {out_dir / 'last.pt'} does not exist (train without --resume first)")
    elif existing and not overwrite:
        raise UsageError(
            f"{out_dir} already holds a run ({', '.join(existing)}); use --resume to continue it, "
            "--overwrite to start over, or another --out-dir"
        )
    return existing


def make_out_dir(out_dir: Path) -> None:
    """Create the run folder and prove it writable; drop stale temps (an overwritten run's files go at its first
    step: RunFolder.begin)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / ".write-test", lambda f: f.write(b"ok"))
        (out_dir / ".write-test").unlink()
    except OSError as e:
        raise UsageError(f"cannot write to --out-dir {out_dir}: {e.strerror}; choose a writable folder") from None
    for name in (*RUN_FILES, ".write-test"):  # any file written atomically here may have a temp left by a kill
        remove_stale_temps(out_dir / name)


class RunFolder:
    """Where the loop's checkpoints go. config.yaml is written with the first of them, so that a run stopped before
    its first step leaves nothing behind; ranks other than 0 write nothing."""

    def __init__(
        self,
        path: Path,
        config: Config,
        tokenizer: Tokenizer,
        writes: bool = True,
        replaced: list[str] | None = None,
        notes: dict[str, Any] | None = None,
    ):
        self.path, self.config, self.tokenizer, self.writes = path, config, tokenizer, writes
        self.notes = dict(notes or {})  # JSON files written beside config.yaml: budget.json, how the recipe was chosen
        self.config_written = False
        self.replaced = list(replaced or [])  # an overwritten run's files, kept until this run has trained a step

    def begin(self) -> None:
        """Remove the overwritten run's files: once, before this run writes its first record or checkpoint, so that
        a run that fails or is stopped before its first step leaves the old one whole."""
        if self.writes:
            for name in self.replaced:
                (self.path / name).unlink(missing_ok=True)
        self.replaced = []

    def save(self, name: str, model: nn.Module, state: RunState, parts: dict[str, Any]) -> Path:
        target = self.path / name
        if not self.writes:
            return target
        try:
            if not self.config_written:
                atomic_write(self.path / "config.yaml", lambda f: f.write(self.config.to_yaml().encode()))
                for name, note in self.notes.items():
                    atomic_write(self.path / name, lambda f, note=note: f.write(json.dumps(note, indent=1).encode()))
                self.config_written = True
            save_training_checkpoint(target, self.config, self.tokenizer, model, state, parts)
        except OSError as e:
            raise SaveFailed(f"could not write checkpoint {target}: {e.strerror or e}") from e
        return target
