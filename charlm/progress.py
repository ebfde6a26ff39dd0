"""What the user sees while a command runs: a progress bar on a TTY, a line per evaluation, warnings.

Everything here goes to stderr, so stdout stays free for results (and for exactly one JSON object with --json).
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from rich.console import Console
from tqdm import tqdm


def _console(stream) -> Console:
    # No ANSI codes at all (not even bold) when the stream is not a terminal or NO_COLOR is set. No emoji codes
    # either: rich would print a value such as ":x:" in a message, a path or a model's text as an emoji.
    plain = not stream.isatty() or "NO_COLOR" in os.environ
    return Console(file=stream, color_system=None if plain else "auto", highlight=False, soft_wrap=True, emoji=False)


def stderr_console() -> Console:
    return _console(sys.stderr)


def stdout_console() -> Console:
    return _console(sys.stdout)


def fancy_output() -> bool:
    """Progress bars only for a person: at a terminal (stderr is a TTY) or in a notebook, and NO_COLOR not set."""
    return (sys.stderr.isatty() or in_notebook()) and "NO_COLOR" not in os.environ


def in_notebook() -> bool:
    """Running inside a Jupyter kernel: bars become notebook widgets (tqdm.auto)."""
    return "ipykernel" in sys.modules


def progress_bar(**options: Any) -> tqdm:
    if in_notebook():
        from tqdm.auto import tqdm as notebook_tqdm

        return notebook_tqdm(**options)
    return tqdm(file=sys.stderr, dynamic_ncols=True, **options)


class TrainReporter:
    """Progress bar with step, loss, lr and tokens/s; one row per evaluation; warnings.

    The bar follows the limit that ends the run: elapsed seconds against train.max_seconds (with an ETA) when a time
    budget is set, else steps against train.max_steps. It redraws a few times a second at most; the loop may call
    step() every step.
    """

    REDRAW_S = 0.25

    def __init__(self, quiet: bool = False, silent: bool = False):
        self.quiet = quiet or silent
        self.silent = silent  # not even warnings: for the ranks other than 0 under torchrun
        self.console = stderr_console()
        self.bar: tqdm | None = None
        self.header_shown = False
        self.max_seconds = 0.0
        self.started = self.last_draw = 0.0

    def start(self, first_step: int, max_steps: int | None, max_seconds: float = 0.0) -> None:
        self.started = time.perf_counter()
        self.last_draw = -math.inf
        if self.quiet or not fancy_output():
            return
        self.max_seconds = max_seconds
        if max_seconds:
            self.bar = progress_bar(
                total=max_seconds,
                unit="s",
                leave=False,
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]",
            )
        else:
            self.bar = progress_bar(total=max_steps, initial=first_step, unit="step", leave=False)

    def step(self, step: int, loss: Any, lr: float, tokens_per_s: float) -> None:
        """loss may be a tensor: it is read (a device sync on GPUs) only when the bar redraws."""
        if self.bar is None:
            return
        now = time.perf_counter()
        if now - self.last_draw < self.REDRAW_S:
            return
        self.last_draw = now
        if self.max_seconds:
            self.bar.n = min(now - self.started, self.max_seconds)
            postfix = f"step {step:,} "
        else:
            self.bar.n = step
            postfix = ""
        postfix += f"loss {float(loss):.4f} lr {lr:.2e} {tokens_per_s / 1000:.1f}k tok/s"
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.refresh()

    def evaluation(
        self,
        step: int,
        train_loss: float,
        val_loss: float,
        lr: float,
        tokens_per_s: float,
        elapsed_s: float,
        improved: bool,
        accuracy: float | None = None,
    ) -> None:
        """One line per evaluation; `accuracy` (train.best_by accuracy) adds the validation accuracy, which then
        chooses best.pt (the mark)."""
        if self.quiet:
            return
        acc = f"  {'val acc':>7}" if accuracy is not None else ""
        if not self.header_shown:
            self._print(
                f"[bold]{'step':>8}  {'train':>7}  {'val':>7}{acc}  {'lr':>8}  {'tok/s':>7}  {'time':>7}[/bold]"
            )
            self.header_shown = True
        mark = " [green]*[/green]" if improved else ""
        acc = f"  {100 * accuracy:>6.2f}%" if accuracy is not None else ""
        self._print(
            f"{step:>8}  {train_loss:>7.4f}  {val_loss:>7.4f}{acc}  {lr:>8.2e}  "
            f"{tokens_per_s / 1000:>6.1f}k  {elapsed_s:>6.1f}s{mark}"
        )

    def info(self, message: str) -> None:
        if not self.quiet:
            self._print(message)

    def warn(self, message: str) -> None:
        self._print(f"[yellow]warning:[/yellow] {message}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _print(self, text: str) -> None:
        if self.silent:
            return
        if self.bar is not None:
            with tqdm.external_write_mode(file=sys.stderr):
                self.console.print(text)
        else:
            self.console.print(text)


class DownloadBar:
    """A byte progress bar on a TTY; silent otherwise."""

    def __init__(self, name: str):
        self.name = name
        self.bar: tqdm | None = None

    def __enter__(self) -> DownloadBar:
        return self

    def update(self, received: int, total: int | None) -> None:
        if not fancy_output():
            return
        if self.bar is None:
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=self.name, file=sys.stderr, leave=False)
        self.bar.update(received - self.bar.n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
