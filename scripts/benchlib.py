"""Shared by the benchmark scripts: running charlm and timing it, nanoGPT's shape, what machine this is, and
appending rows to docs/benchmarks.md."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def command() -> str:
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def append_section(title: str, header: list[str], rows: list[list[str]]) -> None:
    """Append a dated Markdown table (with machine, torch version and the exact command) to docs/benchmarks.md."""
    BENCHMARKS.parent.mkdir(parents=True, exist_ok=True)
    if not BENCHMARKS.exists():
        BENCHMARKS.write_text("# Benchmarks\n\nFigures appended by the scripts in `scripts/`; newest last.\n")
    lines = [
        "",
        f"## {title}",
        "",
        f"{datetime.date.today().isoformat()} · {machine()} · torch {torch.__version__} · `{command()}`",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    with open(BENCHMARKS, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# nanoGPT's CPU recipe shape (its README's "baby" CPU run) as charlm settings: one definition for every script.
NANOGPT_SHAPE = [
    "model.n_layer=4",
    "model.n_head=4",
    "model.n_embd=128",
    "model.block_size=64",
    "model.dropout=0.0",
    "train.batch_size=12",
    "train.max_steps=600",
]


def set_args(items: list[str]) -> list[str]:
    """`--set KEY=VALUE` pairs for a charlm command line."""
    return [x for item in items for x in ("--set", item)]


def run_timed(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run a command (`env`: variables added to this process's); its stdout and wall seconds, or exit naming the
    command and showing its output's end."""
    started = time.perf_counter()
    full_env = {**os.environ, **env} if env else None
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, env=full_env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return result.stdout, wall


def run_charlm(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[dict, float]:
    """`python -m charlm ARGS --json` (and --quiet for train) in a fresh process: its JSON and wall seconds."""
    extra = ["--json", "--quiet"] if args[0] == "train" else ["--json"]
    out, wall = run_timed([sys.executable, "-m", "charlm", *args, *extra], cwd, env)
    return json.loads(out.strip().splitlines()[-1]), wall
