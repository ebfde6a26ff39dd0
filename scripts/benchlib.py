"""Shared by the benchmark scripts: what machine this is, and appending rows to docs/benchmarks.md."""

from __future__ import annotations

import datetime
import platform
import shlex
import sys
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
