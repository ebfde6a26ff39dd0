"""The learning-rate schedule: warmup, then a decay over the run's budget or ReduceLROnPlateau; one owner of the lr.

The loop asks `lr(step, elapsed_s)` before every step and reports each validation loss with `observe(val_loss)`.
Nothing here touches an optimizer, so it is a pure, testable object.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from charlm.config.schema import TrainConfig

PLATEAU_THRESHOLD = 1e-4  # relative improvement that counts as better (torch's ReduceLROnPlateau default)


@dataclass
class PlateauState:
    lr: float  # the current plateau learning rate
    best: float = math.inf  # best validation loss seen after warmup
    bad_checks: int = 0  # validation checks since the last improvement or reduction


class LRSchedule:
    """Linear warmup from 0, then: cosine or linear decay to min_lr over max_steps or max_seconds (whichever is
    nearer to done), the peak held and a linear decay over the budget's last `warmdown` share (wsd), or a plateau
    rule that multiplies the lr by plateau_factor after more than plateau_patience checks without a relative
    improvement of PLATEAU_THRESHOLD (never below min_lr)."""

    def __init__(self, tc: TrainConfig):
        self.tc = tc
        self.plateau = PlateauState(lr=tc.lr)

    def lr(self, step: int, elapsed_s: float) -> float:
        """The learning rate for optimizer step `step` (0-based), `elapsed_s` seconds into this invocation."""
        tc = self.tc
        if step < tc.warmup_steps:
            return tc.lr * (step + 1) / tc.warmup_steps
        if tc.lr_schedule == "plateau":
            return self.plateau.lr
        done = min(
            1.0,
            max(step / tc.max_steps if tc.max_steps else 0.0, elapsed_s / tc.max_seconds if tc.max_seconds else 0.0),
        )
        if tc.lr_schedule == "cosine":
            shape = 0.5 * (1 + math.cos(math.pi * done))
        elif tc.lr_schedule == "wsd":  # the peak until the last `warmdown` of the budget, then a straight line down
            shape = min(1.0, (1.0 - done) / tc.warmdown)
        else:
            shape = 1.0 - done
        return tc.min_lr + (tc.lr - tc.min_lr) * shape

    def observe(self, val_loss: float, step: int) -> bool:
        """A validation loss after `step` steps; True when the plateau rule lowered the lr."""
        tc, p = self.tc, self.plateau
        if tc.lr_schedule != "plateau" or step < tc.warmup_steps:
            return False
        if val_loss < p.best * (1 - PLATEAU_THRESHOLD):
            p.best, p.bad_checks = val_loss, 0
            return False
        p.bad_checks += 1
        if p.bad_checks <= tc.plateau_patience:
            return False
        p.bad_checks = 0
        lowered = max(p.lr * tc.plateau_factor, tc.min_lr)
        changed = p.lr - lowered > 1e-8
        p.lr = lowered if changed else p.lr
        return changed

    def describe(self) -> str:
        """One line for the training header: the schedule in use and how to switch."""
        tc = self.tc
        warmup = f"{tc.warmup_steps} warmup steps, then " if tc.warmup_steps else ""
        if tc.lr_schedule == "plateau":
            rule = (
                f"ReduceLROnPlateau (x{tc.plateau_factor:g} after {tc.plateau_patience + 1} stalled checks, "
                f"floor {tc.min_lr:g})"
            )
            other = "cosine"
        else:
            budget = " or ".join(
                b
                for b in (
                    f"{tc.max_steps:,} steps" if tc.max_steps else "",
                    f"{tc.max_seconds:g} s" if tc.max_seconds else "",
                )
                if b
            )
            if tc.lr_schedule == "wsd":
                rule = f"{tc.lr:g} held, then linear decay to {tc.min_lr:g} over the last {tc.warmdown:.0%} of {budget}"
            else:
                rule = f"{tc.lr_schedule} decay from {tc.lr:g} to {tc.min_lr:g} over {budget}"
            other = "plateau"
        stop = (
            f"; early stop after {tc.early_stop_patience} checks without improvement" if tc.early_stop_patience else ""
        )
        return f"lr schedule: {warmup}{rule}{stop} (switch with --set train.lr_schedule={other})"

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.plateau)

    def load_state_dict(self, state: dict[str, Any], current_lr: float) -> None:
        """Restore the plateau state; also reads the torch ReduceLROnPlateau state of checkpoints before this module."""
        if "num_bad_epochs" in state:  # written by torch.optim.lr_scheduler.ReduceLROnPlateau
            self.plateau = PlateauState(
                lr=current_lr, best=float(state["best"]), bad_checks=int(state["num_bad_epochs"])
            )
        else:
            self.plateau = PlateauState(
                lr=float(state["lr"]), best=float(state["best"]), bad_checks=int(state["bad_checks"])
            )
