"""Errors that the CLI turns into one line on stderr and an exit code."""

from __future__ import annotations

import shlex
from pathlib import Path

USAGE_EXIT = 2  # something the user gave is wrong: flag, config, data file, checkpoint, prompt
FAILURE_EXIT = 1  # the work itself failed: network, disk, a diverged run


class CharlmError(Exception):
    """An error meant for the user: its message says what is wrong and how to fix it."""

    exit_code = FAILURE_EXIT

    def __init__(self, message: str, *, details: list[str] | None = None):
        super().__init__(message)
        self.details = details or []


class UsageError(CharlmError):
    """The user's input (flags, config, data, checkpoint, prompt) is wrong."""

    exit_code = USAGE_EXIT


class WorkError(CharlmError):
    """The work failed for a reason outside the user's input (network, disk, divergence)."""

    exit_code = FAILURE_EXIT


class SaveFailed(WorkError):
    """A checkpoint could not be written (a full disk): the previous one is untouched and the run can resume."""

    def __init__(self, what: str, todo: str = "free some disk space, then resume the run"):
        super().__init__(f"{what}; the previous checkpoint is untouched ({todo})")
        self.what = what


class Interrupted(CharlmError):
    """SIGINT or SIGTERM: exit with 128 + the signal's number, as shells report it (130, 143)."""

    def __init__(self, message: str, signum: int, saved: Path | None = None):
        super().__init__(message)
        self.signum, self.saved = signum, saved  # saved: the checkpoint written before stopping, if any
        self.exit_code = 128 + signum


def shell_path(path: Path | str) -> str:
    """A path as a command in a message or a model card takes it: quoted where the shell would split or expand it."""
    return shlex.quote(str(path))
