"""Where a run's figures go (train.loggers): the loop and the run call one MetricsLog, which feeds every logger.

Each logger receives the resolved configuration at the start, the training loss / lr / tokens/s every
train.log_interval steps, every evaluation, and the final summary; each is closed at the end and on interruption.
- jsonl (always on): metrics.jsonl (one line per evaluation, as `charlm plot` reads it), steps.jsonl, summary.json
- csv: metrics.csv, one row per log (kind = step, eval or summary)
- tensorboard: OUT_DIR/tensorboard event files (scalars, the configuration as text, the summary as hparams)
- wandb: a Weights & Biases run in OUT_DIR/wandb (WANDB_MODE=offline works without an account)
Only rank 0 writes: the other ranks get a MetricsLog with enabled=False, so the loop needs no rank checks.
"""

from __future__ import annotations

import csv
import json
import os
import uuid
from pathlib import Path
from typing import Any

from charlm.config.schema import Config
from charlm.errors import UsageError
from charlm.files import atomic_write

EVAL_FIELDS = ("step", "tokens", "step_loss", "train_loss", "val_loss", "lr", "tokens_per_s", "elapsed_s", "time")
STEP_FIELDS = ("step", "tokens", "step_loss", "lr", "tokens_per_s", "elapsed_s", "time")
CSV_FIELDS = ("kind",) + EVAL_FIELDS + ("full_val_loss", "full_val_bpc")
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}  # logger: (module, extra)


def logger_names(config: Config) -> list[str]:
    names = ["jsonl"] + [n for n in config.train.loggers if n != "jsonl"]
    if config.train.tensorboard and "tensorboard" not in names:  # the older spelling
        names.append("tensorboard")
    return list(dict.fromkeys(names))


def require_loggers(config: Config) -> None:
    """Refuse before training starts when a logger's package is missing, naming the install command."""
    for name in logger_names(config):
        if name not in PACKAGES:
            continue
        module, extra = PACKAGES[name]
        try:
            __import__(module)
            if name == "tensorboard":
                import torch.utils.tensorboard  # noqa: F401  (torch's writer needs the package too)
        except ImportError:
            raise UsageError(
                f'the {name} logger needs the {module} package: pip install -e ".[{extra}]" in your '
                f"charlm checkout (or pip install {module}); or drop it from train.loggers"
            ) from None


class JsonlLogger:
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir

    def start(self, config: Config) -> None:
        pass  # the run folder's config.yaml holds the configuration

    def _append(self, name: str, fields: tuple[str, ...], record: dict[str, Any]) -> None:
        with open(self.out_dir / name, "a", encoding="utf-8") as f:
            f.write(json.dumps({key: record.get(key) for key in fields}) + "\n")

    def step(self, record: dict[str, Any]) -> None:
        self._append("steps.jsonl", STEP_FIELDS, record)

    def evaluation(self, record: dict[str, Any]) -> None:
        chosen_by = ("val_accuracy",) if "val_accuracy" in record else ()  # train.best_by accuracy
        self._append("metrics.jsonl", EVAL_FIELDS + chosen_by, record)

    def finish(self, summary: dict[str, Any]) -> None:
        atomic_write(self.out_dir / "summary.json", lambda f: f.write((json.dumps(summary) + "\n").encode()))

    def close(self) -> None:
        pass


class CsvLogger:
    def __init__(self, out_dir: Path):
        self.path = out_dir / "metrics.csv"

    def start(self, config: Config) -> None:
        if not self.path.exists():
            self._row({name: name for name in CSV_FIELDS})

    def _row(self, values: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8", newline="") as f:
            csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore").writerow(values)

    def step(self, record: dict[str, Any]) -> None:
        self._row({"kind": "step", **record})

    def evaluation(self, record: dict[str, Any]) -> None:
        self._row({"kind": "eval", **record})

    def finish(self, summary: dict[str, Any]) -> None:
        self._row(
            {
                "kind": "summary",
                "step": summary["steps"],
                "tokens": summary["tokens"],
                "val_loss": summary["best_val_loss"],
                "tokens_per_s": summary["tokens_per_s"],
                "elapsed_s": summary["wall_s"],
                "full_val_loss": summary["full_val_loss"],
                "full_val_bpc": summary["full_val_bpc"],
            }
        )

    def close(self) -> None:
        pass


class TensorBoardLogger:
    def __init__(self, out_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out_dir / "tensorboard"))

    def start(self, config: Config) -> None:
        self.writer.add_text("config", "```yaml\n" + config.to_yaml() + "```", 0)

    def _scalars(self, record: dict[str, Any], keys: tuple[str, ...], prefix: str) -> None:
        for key in keys:
            if record.get(key) is not None:
                self.writer.add_scalar(f"{prefix}{key}", record[key], record["step"])
        self.writer.flush()

    def step(self, record: dict[str, Any]) -> None:
        self._scalars(record, ("step_loss", "lr", "tokens_per_s"), "train/")

    def evaluation(self, record: dict[str, Any]) -> None:
        self._scalars(record, ("train_loss", "val_loss", "lr", "tokens_per_s", "val_accuracy"), "")

    def finish(self, summary: dict[str, Any]) -> None:
        figures = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.writer.add_text("summary", json.dumps(summary, indent=2), summary["steps"])
        for key in ("full_val_loss", "full_val_bpc", "best_val_loss"):
            self.writer.add_scalar(f"summary/{key}", figures[key], summary["steps"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, out_dir: Path, config: Config):
        import wandb

        id_file = out_dir / ".wandb-run-id"  # a resumed run continues the same W&B run
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(
            project=config.train.wandb_project,
            dir=str(out_dir),
            id=run_id,
            resume="allow",
            name=out_dir.name,
            mode=os.environ.get("WANDB_MODE", "online"),
            reinit=True,
        )

    def start(self, config: Config) -> None:
        self.run.config.update(config.to_dict(), allow_val_change=True)

    def step(self, record: dict[str, Any]) -> None:
        self.run.log({f"train/{k}": record[k] for k in ("step_loss", "lr", "tokens_per_s")}, step=record["step"])

    def evaluation(self, record: dict[str, Any]) -> None:
        keys = ("train_loss", "val_loss", "lr", "tokens_per_s", "val_accuracy")  # val_accuracy: train.best_by accuracy
        self.run.log({k: record[k] for k in keys if k in record}, step=record["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(summary)

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """Every logger of train.loggers behind one object; opened when the run starts, closed when it ends."""

    def __init__(self, out_dir: Path, config: Config, enabled: bool = True):
        self.out_dir, self.config, self.enabled = out_dir, config, enabled
        self.loggers: list[Any] = []
        self.started = False

    def _open(self) -> list[Any]:
        """Opened at the first record, so that nothing is written before training has done a step."""
        if self.enabled and not self.started:
            self.started = True
            for name in logger_names(self.config):
                logger = {"jsonl": JsonlLogger, "csv": CsvLogger, "tensorboard": TensorBoardLogger}.get(name)
                self.loggers.append(logger(self.out_dir) if logger else WandbLogger(self.out_dir, self.config))
                self.loggers[-1].start(self.config)
        return self.loggers

    def step(self, record: dict[str, Any]) -> None:
        for logger in self._open():
            logger.step(record)

    def evaluation(self, record: dict[str, Any]) -> None:
        for logger in self._open():
            logger.evaluation(record)

    def finish(self, summary: dict[str, Any]) -> None:
        for logger in self._open():
            logger.finish(summary)

    def close(self) -> None:
        loggers, self.loggers = self.loggers, []
        for logger in loggers:
            logger.close()
