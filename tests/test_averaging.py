"""train.ema_decay: the weight average follows its formula, leaves training alone, is what evaluations score and
best.pt keeps, and resumes exactly (also from a checkpoint written before it existed)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import assert_one_line_error, assert_resume_is_exact, run_cli, step_losses, train_cli
from torch import nn

from charlm.storage.checkpoint import load_checkpoint, save_checkpoint
from charlm.training.averaging import WeightAverage

AVERAGED = {"train.ema_decay": 0.9, "train.eval_interval": 10}


def test_the_average_follows_its_formula_and_gives_the_training_weights_back():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    average = WeightAverage(model, decay=0.5)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(1, 7):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        average.update()
        decay = min(0.5, (1 + n) / (10 + n))  # the first updates forget the initial weights faster
        expected = [decay * e + (1 - decay) * p.detach() for e, p in zip(expected, model.parameters(), strict=True)]
    training = [p.detach().clone() for p in model.parameters()]
    with average.in_model():
        assert all(torch.allclose(p, e) for p, e in zip(model.parameters(), expected, strict=True))
        saved = average.state_dict()  # the average, even while it is in the model
    assert all(torch.allclose(t, e) for t, e in zip(saved["weights"].values(), expected, strict=True))
    assert all(torch.equal(p, t) for p, t in zip(model.parameters(), training, strict=True))
    assert saved["updates"] == 6


def evaluations(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [record["val_loss"] for record in map(json.loads, lines) if "val_loss" in record]


def test_evaluations_score_the_average_and_best_pt_keeps_it_while_training_goes_on_unchanged(tmp_path, corpus):
    averaged, plain = tmp_path / "averaged", tmp_path / "plain"
    run_cli(*train_cli(corpus, averaged, steps=30, quiet=True, sets=AVERAGED), check=True)
    run_cli(*train_cli(corpus, plain, steps=30, quiet=True, sets={"train.eval_interval": 10}), check=True)
    assert step_losses(averaged) == step_losses(plain)  # the average never touches the training weights
    last, plain_last = (load_checkpoint(run / "last.pt").state for run in (averaged, plain))
    assert all(torch.equal(last["model"][k], plain_last["model"][k]) for k in plain_last["model"])
    assert plain_last["average"] is None and last["average"]["updates"] == 30
    average = last["average"]["weights"]
    assert any(not torch.equal(last["model"][k], average[k]) for k in average)
    scores = evaluations(averaged)
    assert len(scores) == 3 and scores != evaluations(plain)  # the evaluations scored another model: the average
    best = load_checkpoint(averaged / "best.pt").state
    assert best["step"] == 30 and scores[-1] == min(scores)  # the last evaluation was the best: best.pt was saved then
    assert all(torch.equal(best["model"][k], average[k]) for k in average)


def test_a_run_with_an_average_resumes_exactly(tmp_path, corpus):
    common = train_cli(corpus, sets={**AVERAGED, "train.eval_interval": 3})  # the split at step 6 is an evaluation
    assert_resume_is_exact(common, tmp_path, steps=12)
    straight, split = (load_checkpoint(tmp_path / name / "last.pt").state["average"] for name in ("straight", "split"))
    assert straight["updates"] == split["updates"] == 12
    assert all(torch.equal(straight["weights"][k], split["weights"][k]) for k in straight["weights"])


def test_a_checkpoint_from_before_the_average_resumes(tmp_path, corpus):
    run = tmp_path / "run"
    run_cli(*train_cli(corpus, run, steps=10, quiet=True, sets={"train.eval_interval": 10}), check=True)
    old = load_checkpoint(run / "last.pt").state
    del old["average"]  # as charlm wrote checkpoints before train.ema_decay
    save_checkpoint(run / "last.pt", old)
    resumed = run_cli(*train_cli(out=run, resume=True, steps=20, quiet=True))
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(run / "last.pt").step == 20


def test_a_damaged_average_is_refused_in_one_line_on_resume(tmp_path, corpus):
    run = tmp_path / "run"
    run_cli(*train_cli(corpus, run, steps=4, quiet=True, sets={**AVERAGED, "train.eval_interval": 4}), check=True)
    state = load_checkpoint(run / "last.pt").state
    name = next(iter(state["average"]["weights"]))
    state["average"]["weights"][name] = torch.zeros(1)  # broadcasts into any tensor: must not be taken
    save_checkpoint(run / "last.pt", state)
    resumed = run_cli(*train_cli(out=run, resume=True, steps=8, quiet=True))
    assert_one_line_error(resumed, 2, "cannot be resumed", f"weight average of {name}")
