"""SIGINT and SIGTERM for the command line: installed by `charlm train` around a run, never by the library.

Before the first optimizer step (start-up, data, torch.compile) a signal ends the process at once: nothing is worth
saving yet, and torch.compile would swallow an exception raised from the handler and compile on for many seconds.
Once the loop calls `arm()`, a signal only records its number; the loop saves at the next step boundary and raises
Interrupted. A second signal while that happens changes nothing.

The library's training function takes any object with `requested` and `arm()` (see charlm.training.setup.StopRequest);
called from Python it uses one that never fires, so a notebook keeps its own handlers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """A context manager that owns SIGINT/SIGTERM for the duration of a command, then puts the old handlers back."""

    def __init__(self, before_exit: Callable[[], None] | None = None):
        self.requested: int | None = None  # the first signal's number
        self.armed = False
        self.before_exit = before_exit  # tidy-up before an immediate exit (e.g. remove an empty run folder)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for signum in HANDLED:
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.requested is not None:  # leaving because of a signal: keep ignoring repeats until the process exits
            for signum in self._previous:
                signal.signal(signum, signal.SIG_IGN)
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def arm(self) -> None:
        """The first step is done: from now on a signal is acted on at the next step boundary."""
        self.armed = True

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested is None:
            self.requested = signum
        if not self.armed:
            self._exit_now(signum)

    def _exit_now(self, signum: int) -> None:
        name = signal.Signals(signum).name
        sys.stderr.write(f"error: {name} received before training started; nothing was written\n")
        sys.stderr.flush()
        if self.before_exit is not None:
            self.before_exit()
        os._exit(128 + signum)  # not sys.exit: torch.compile would catch the exception and carry on
