"""The loop's one state object: saved whole in every checkpoint, the summary built from it, older checkpoints read."""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch

from charlm.config.build import load_config
from charlm.errors import Interrupted, UsageError
from charlm.storage.checkpoint import load_checkpoint, save_checkpoint
from charlm.storage.run_state import INVOCATION_FIELDS, RunState
from charlm.training.run import run_training

SETS = ["model.n_layer=1", "model.n_embd=32", "model.block_size=16", "train.eval_interval=4", "train.eval_windows=8"]


def test_a_checkpoint_holds_the_run_state_whole_and_the_summary_agrees(tmp_path, corpus):
    config = load_config("tiny", [*SETS, f"data.path={corpus}", "train.max_steps=10"])
    summary = run_training(config, tmp_path / "run", quiet=True)
    assert summary is not None
    stored = load_checkpoint(tmp_path / "run" / "last.pt").state
    saved = RunState.from_dict(stored)
    assert (saved.step, saved.tokens, saved.best_val_loss) == (summary.steps, summary.tokens, summary.best_val_loss)
    assert (saved.world_size, saved.global_batch) == (summary.world_size, summary.global_batch) == (1, 16)
    assert saved.tokens == 10 * 16 * 16 and saved.elapsed_s > 0 and saved.lr > 0 and summary.stop_reason == "max_steps"
    assert stored["train_s"] > 0  # saved whole: this invocation's counters too
    # ...but a resume starts this invocation's counters at zero
    assert all(getattr(saved, name) == getattr(RunState(), name) for name in INVOCATION_FIELDS)


def test_a_checkpoint_from_before_the_run_state_still_resumes(tmp_path, corpus):
    config = load_config("tiny", [*SETS, f"data.path={corpus}", "train.max_steps=8"])
    run_training(config, tmp_path / "run", quiet=True)
    last = tmp_path / "run" / "last.pt"
    state = torch.load(last, weights_only=True)
    for newer in ("tokens", "evals_since_best", "elapsed_s", "lr", *INVOCATION_FIELDS):  # what the oldest lack
        state.pop(newer)
    save_checkpoint(last, state)
    old = last.read_bytes()
    summary = run_training(None, tmp_path / "run", resume=True, resume_changes={"train.max_steps": 12}, quiet=True)
    assert summary is not None and summary.steps == 12
    assert summary.tokens == 4 * 16 * 16  # counted from the resume: the old checkpoint did not record its own
    assert math.isfinite(summary.best_val_loss)
    last.write_bytes(old)  # and with nothing left to train: refused, the old checkpoint as it was
    with pytest.raises(UsageError, match="is at step 8, already its limit of 8 steps"):
        run_training(None, tmp_path / "run", resume=True, resume_changes={"train.max_steps": 8}, quiet=True)
    assert last.read_bytes() == old


class StopAfter:
    """A stop request that arrives while the given step runs (as a Ctrl-C would)."""

    def __init__(self, step: int):
        self.requested: int | None = None
        self.step, self.armed = step, 0

    def arm(self) -> None:  # called once each step is done
        self.armed += 1
        if self.armed == self.step:
            self.requested = signal.SIGINT


def test_a_stop_during_a_step_due_for_evaluation_keeps_that_evaluation(tmp_path, corpus):
    config = load_config("tiny", [*SETS, f"data.path={corpus}", "train.max_steps=100"])
    with pytest.raises(Interrupted) as stopped:
        run_training(config, tmp_path / "run", quiet=True, stop=StopAfter(4))
    assert stopped.value.saved == tmp_path / "run" / "last.pt"
    evaluations = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evaluations if "val_loss" in e] == [4]  # evaluated, then saved and stopped
    assert load_checkpoint(tmp_path / "run" / "best.pt").step == load_checkpoint(stopped.value.saved).step == 4
