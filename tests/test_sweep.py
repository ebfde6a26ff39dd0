"""`charlm sweep`: tiny sweeps through the real CLI and Optuna study, ranked, pruned, killed and continued, refused
specs and a second sweep into a busy folder (docs/sweeps.md)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, assert_one_line_error, freeze, run_cli, train_cli

from charlm.config.build import load_config

# A model that trains in a fraction of a second; every trial evaluates every 10 steps.
FIXED = {
    "model.n_layer": 1,
    "model.n_embd": 32,
    "model.block_size": 16,
    "train.eval_interval": 10,
    "train.eval_windows": 16,
}
HANG_S = 300  # only a guard against a hung process: every wait below is for an event of the sweep


def write_spec(folder: Path, corpus: Path, params: dict, name: str = "spec.yaml", **top: object) -> Path:
    spec = {"config": "tiny", "set": {**FIXED, "data.path": str(corpus)}, "budget": {"steps": 20}, "trials": 3}
    spec |= {"sampler": "random", "params": params} | top
    path = folder / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_tiny_sweep_ranks_its_trials_and_writes_a_config_that_train_takes(tmp_path, corpus):
    params = {"train.lr": {"low": 1e-3, "high": 1e-2, "log": True}, "model.n_head": {"choices": [1, 2, 4]}}
    spec, out = write_spec(tmp_path, corpus, params), tmp_path / "sweep"
    results = json.loads(run_cli("sweep", spec, "--out-dir", out, "--json", check=True).stdout)
    rows = results["trials"]
    assert results["trials_counted"] == len(rows) == 3 and [r["rank"] for r in rows] == [1, 2, 3]
    assert all(r["state"] == "complete" and r["steps"] == 20 for r in rows)
    losses = [r["full_val_loss"] for r in rows]
    assert losses == sorted(losses) and results["best"] == rows[0]
    assert sorted(Path(r["folder"]).name for r in rows) == ["trial-000", "trial-001", "trial-002"]
    for row in rows:  # each trial a normal run folder, its loss the summary's full-validation loss of best.pt
        assert json.loads((Path(row["folder"]) / "summary.json").read_text())["full_val_loss"] == row["full_val_loss"]
        assert 1e-3 <= row["params"]["train.lr"] <= 1e-2 and row["params"]["model.n_head"] in (1, 2, 4)
    run_cli("eval", rows[0]["folder"], "--json", check=True)

    best = Path(results["best_config"])
    assert best.read_text().startswith(f"# charlm train --config {best}\n")
    assert load_config(best).train.lr == rows[0]["params"]["train.lr"]
    trained = run_cli("train", "--config", best, "--out-dir", tmp_path / "again", "--max-steps", 2, "--json")
    assert trained.returncode == 0, trained.stderr and json.loads(trained.stdout)["steps"] == 2

    again = run_cli("sweep", spec, "--out-dir", out, check=True)  # done: nothing runs, the table is printed
    assert "trial-003" not in again.stdout and not (out / "trial-003").exists()
    assert again.stdout.index(Path(rows[0]["folder"]).name) < again.stdout.index(Path(rows[2]["folder"]).name)
    plotted = run_cli("plot", out, "-o", tmp_path / "sweep.png", check=True)
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG", plotted.stderr

    other = write_spec(tmp_path, corpus, params, name="other.yaml", seed=7)
    assert_one_line_error(run_cli("sweep", other, "--out-dir", out), 2, str(out), "another spec", "seed")


def test_pruning_stops_a_hopeless_trial_on_its_own_evaluations(tmp_path, corpus):
    """A grid's fourth trial, at a learning rate that learns nothing, falls behind the three before it at the same
    share of its budget and is pruned there, before its last step."""
    params = {"train.lr": {"choices": [3e-3, 4e-3, 5e-3, 1e-7]}}
    spec = write_spec(tmp_path, corpus, params, sampler="grid", prune=True, budget={"steps": 40}, trials=4)
    results = json.loads(run_cli("sweep", spec, "--out-dir", tmp_path / "s", "--json", check=True).stdout)
    states = {r["params"]["train.lr"]: r["state"] for r in results["trials"]}
    assert states == {3e-3: "complete", 4e-3: "complete", 5e-3: "complete", 1e-7: "pruned"}, results["trials"]
    pruned = results["trials"][-1]
    evaluations = (Path(pruned["folder"]) / "metrics.jsonl").read_text().splitlines()
    assert json.loads(evaluations[-1])["step"] < 40 and "pruned at step" in pruned["stopped"]


@pytest.mark.process
def test_a_sweep_killed_mid_trial_goes_on_with_the_same_command_counting_each_trial_once(tmp_path, corpus):
    """SIGKILL while the first trial trains (after its first evaluation is written, the process stopped so that the
    kill lands inside that trial); meanwhile a second sweep into the folder is refused. The same command then finishes
    the sweep: three trials, each grid value once, the killed trial rerun in its own folder."""
    params = {"model.n_head": {"choices": [1, 2, 4]}}
    spec = write_spec(tmp_path, corpus, params, sampler="grid", budget={"steps": 80})
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "charlm", "sweep", str(spec), "--out-dir", str(out), "--json"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + HANG_S
        while not (out / "trial-000" / "metrics.jsonl").exists():
            assert proc.poll() is None, f"the sweep exited {proc.returncode} before its first evaluation"
            assert time.monotonic() < deadline, "no evaluation of the first trial"
            time.sleep(0.001)
        freeze(proc.pid)
        busy = run_cli("sweep", spec, "--out-dir", out)
        assert_one_line_error(busy, 2, f"another charlm sweep (pid {proc.pid}) is running in {out}")
    finally:
        proc.kill()
        proc.wait()
    assert not (out / "trial-000" / "summary.json").exists()  # the kill landed inside the first trial
    unplotted = run_cli("plot", out, "-o", tmp_path / "early.png")  # a sweep, not a run folder without metrics
    assert_one_line_error(unplotted, 2, "is a sweep that holds no completed trial yet", "run its command again")

    results = json.loads(run_cli("sweep", spec, "--out-dir", out, "--json", check=True).stdout)
    rows = results["trials"]
    assert results["trials_counted"] == len(rows) == 3 and results["trials_cut_short"] == 1
    assert sorted(r["params"]["model.n_head"] for r in rows) == [1, 2, 4]
    assert sorted(Path(r["folder"]).name for r in rows) == ["trial-000", "trial-001", "trial-002"]
    assert all(r["state"] == "complete" and r["steps"] == 80 for r in rows)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("trial-")) == [
        "trial-000",
        "trial-001",
        "trial-002",
    ]


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"params": {"model.n_layers": {"choices": [1, 2]}}}, ["model.n_layers", "did you mean 'model.n_layer'"]),
        ({"params": {"train.lr": {"low": 1e-2, "high": 1e-3}}}, ["train.lr", "range is empty"]),
        ({"params": {"model.n_head": {"choices": []}}}, ["model.n_head", "choices is empty"]),
        ({"params": {"train.lr": {"choices": 0.001}}}, ["train.lr", "choices must be a list", "[0.001]"]),
        ({"params": {"model.n_head": {"choices": [1, 2, 1]}}}, ["model.n_head", "lists 1 twice"]),
        ({"params": ["train.lr"]}, ["params must map each key", "['train.lr']"]),
        ({"params": {"model.n_head": {"choices": [1, "two"]}}}, ["model.n_head", "expected an integer", "'two'"]),
        ({"params": {"train.batch_size": {"low": 4, "high": 16}}}, ["train.batch_size", "int: true"]),
        ({"params": {"train.dropout": {"choices": [0.1]}}}, ["train.dropout", "unknown key"]),
        ({"params": {"model.dropout": {"low": 0.0, "high": 2.0}}}, ["model.dropout", "must be < 1.0"]),
        ({"params": {"train.lr": {"low": 0.0, "high": 1e-2, "log": True}}}, ["train.lr", "log-scaled", "above 0"]),
        ({"params": {"train.max_steps": {"choices": [5, 10]}}}, ["train.max_steps", "budget"]),
        ({"budget": None}, ["budget is missing"]),
        ({"budget": "10x"}, ["budget", "'10x'", "10m"]),
        ({"budget": 90}, ["budget: time 90 has no unit", "90s"]),
        ({"budget": {"time": 1}}, ["budget: time 1 has no unit"]),
        ({"budget": "5s"}, ["too short", "at least 10s"]),
        ({"sampler": "grid"}, ["sampler grid", "train.lr has a range"]),
        ({"sampler": "bayes"}, ["sampler", "grid, random, tpe", "'bayes'"]),
        ({"trails": 3}, ["unknown key 'trails'", "did you mean 'trials'"]),
        ({"set": {"model.n_head": 5}}, ["model.n_embd (32) must be divisible by model.n_head (5)"]),
    ],
)
def test_a_bad_spec_is_refused_in_one_line_before_any_trial(tmp_path, corpus, change, needles):
    params = {"train.lr": {"low": 1e-3, "high": 1e-2, "log": True}}
    spec = write_spec(tmp_path, corpus, params)
    raw = yaml.safe_load(spec.read_text())
    for key, value in change.items():
        if key == "set":
            raw["set"] |= value
        elif value is None:
            raw.pop(key)
        else:
            raw[key] = value
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / "sweep"
    assert_one_line_error(run_cli("sweep", spec, "--out-dir", out), 2, *needles)
    assert not out.exists()


def test_a_missing_base_config_is_said_beside_the_spec_s_other_problems(tmp_path, corpus):
    spec = write_spec(tmp_path, corpus, {"model.n_head": {"choices": [1, 2]}})
    raw = yaml.safe_load(spec.read_text())
    raw["config"] = "nowhere.yaml"
    raw.pop("trials")
    spec.write_text(yaml.safe_dump(raw))
    result = run_cli("sweep", spec, "--out-dir", tmp_path / "sweep")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "2 problems" in result.stderr and "config: config file not found: nowhere.yaml" in result.stderr
    assert "trials is missing" in result.stderr and not (tmp_path / "sweep").exists()


def test_a_key_given_twice_in_a_spec_or_a_config_is_refused_in_one_line(tmp_path, corpus):
    """YAML keeps the last of two equal keys without a word: a second `set:` would drop the first one's keys."""
    spec = write_spec(tmp_path, corpus, {"train.lr": {"low": 1e-3, "high": 1e-2, "log": True}})
    spec.write_text(spec.read_text() + "set:\n  train.lr: 0.5\n")
    out = tmp_path / "sweep"
    assert_one_line_error(run_cli("sweep", spec, "--out-dir", out), 2, "the key 'set' appears twice", "line")
    assert_one_line_error(run_cli("sweep", tmp_path, "--out-dir", out), 2, "is a folder")
    config = tmp_path / "twice.yaml"
    config.write_text("train:\n  max_steps: 2\nmodel:\n  n_layer: 1\ntrain:\n  lr: 0.5\n")
    result = run_cli(*train_cli(corpus, tmp_path / "run", config=config))
    assert_one_line_error(result, 2, "twice.yaml", "line 5", "the key 'train' appears twice")
    assert not out.exists() and not (tmp_path / "run").exists()


def test_a_grid_with_a_combination_that_is_no_config_is_refused_before_any_trial(tmp_path, corpus):
    params = {"model.n_embd": {"choices": [32, 48]}, "model.n_head": {"choices": [2, 3]}}
    fixed = {k: v for k, v in FIXED.items() if k != "model.n_embd"} | {"data.path": str(corpus)}
    spec = write_spec(tmp_path, corpus, params, sampler="grid", trials=4, set=fixed)
    out = tmp_path / "sweep"
    needles = ["model.n_embd=32, model.n_head=3", "must be divisible by model.n_head (3)"]
    assert_one_line_error(run_cli("sweep", spec, "--out-dir", out), 2, *needles)
    assert not out.exists()


def test_a_second_sweep_into_a_busy_folder_is_refused_and_runs_once_it_is_free(tmp_path, corpus):
    """Another sweep's lock (an flock on sweep.lock, held here as that sweep's process holds it) refuses this one;
    let go, the same command runs."""
    spec = write_spec(tmp_path, corpus, {"model.n_head": {"choices": [1, 2]}}, trials=1, budget={"steps": 5})
    out = tmp_path / "sweep"
    out.mkdir()
    with open(out / "sweep.lock", "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        assert_one_line_error(run_cli("sweep", spec, "--out-dir", out), 2, "another charlm sweep (pid 4242)", str(out))
    assert json.loads(run_cli("sweep", spec, "--out-dir", out, "--json", check=True).stdout)["trials_counted"] == 1


def test_a_folder_that_is_no_sweep_is_not_swept_into(tmp_path, corpus):
    spec = write_spec(tmp_path, corpus, {"model.n_head": {"choices": [1, 2]}}, trials=1)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert_one_line_error(run_cli("sweep", spec, "--out-dir", tmp_path / "busy"), 2, "not a sweep", "--out-dir")
    under_a_file = tmp_path / "busy" / "notes.txt" / "sweep"
    refused = run_cli("sweep", spec, "--out-dir", under_a_file)
    assert_one_line_error(refused, 2, "cannot write to --out-dir", "notes.txt is a file, not a folder")


def test_a_finished_sweep_asked_for_fewer_trials_shows_all_it_has(tmp_path, corpus):
    spec = write_spec(tmp_path, corpus, {"model.n_head": {"choices": [1, 2]}}, trials=2, budget={"steps": 2})
    out = tmp_path / "sweep"
    run_cli("sweep", spec, "--out-dir", out, "--quiet", check=True)
    spec.write_text(spec.read_text().replace("trials: 2", "trials: 1"))
    shown = " ".join(run_cli("sweep", spec, "--out-dir", out, "--quiet", check=True).stdout.split())
    assert "2 trials (the spec now asks for 1: none run, none dropped)" in shown, shown


def test_a_damaged_study_is_named_in_one_line(tmp_path, corpus):
    spec = write_spec(tmp_path, corpus, {"model.n_head": {"choices": [1, 2]}}, trials=1, budget={"steps": 2})
    run_cli("sweep", spec, "--out-dir", tmp_path / "sweep", "--quiet", check=True)
    for damage in ("truncated", "not a database"):
        out = shutil.copytree(tmp_path / "sweep", tmp_path / damage)
        study = out / "study.db"
        study.write_bytes(study.read_bytes()[:1000] if damage == "truncated" else b"garbage " * 200)
        assert_one_line_error(run_cli("sweep", spec, "--out-dir", out), 2, f"{study} cannot be opened", "--out-dir")


def test_a_swept_data_path_that_is_missing_is_refused_before_any_trial(tmp_path, corpus):
    params = {"data.path": {"choices": [str(corpus), str(tmp_path / "nowhere.txt")]}}
    spec = write_spec(tmp_path, corpus, params, sampler="grid", trials=2, set=FIXED)
    out = tmp_path / "sweep"
    assert_one_line_error(run_cli("sweep", spec, "--out-dir", out), 2, "nowhere.txt")
    assert not out.exists()


def test_without_optuna_the_sweep_names_the_extra_to_install(tmp_path, corpus, monkeypatch):
    """Optuna made unimportable (None in sys.modules: `import optuna` raises ImportError, as where it is missing), and
    the sweep code imported afresh under it, as in a process where optuna was never there."""
    for name in [m for m in sys.modules if m.split(".")[0] == "optuna" or m == "charlm.training.sweep"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "optuna", None)
    spec = write_spec(tmp_path, corpus, {"model.n_head": {"choices": [1, 2]}}, trials=1)
    result = run_cli("sweep", spec, "--out-dir", tmp_path / "sweep")
    assert_one_line_error(result, 2, 'pip install -e ".[sweep]"')
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_spec_loads_and_starts_with_its_command(path):
    from charlm.training.sweep_spec import load_spec

    spec = load_spec(path.stem)  # by name, as `charlm sweep NAME` finds it
    assert spec.path == path and spec.trials >= 2 and spec.seconds > 0
    assert path.read_text().startswith(f"# charlm sweep configs/sweeps/{path.name}")
