"""train.loggers: each logger writes files that its own reader parses; a missing package is one line up front."""

import csv
import json
import sys

import pytest
from conftest import assert_one_line_error, run_cli, train_cli


def _train(run, corpus, loggers, *sets, env=None):
    """40 steps logged every 5 (SMALL evaluates every 10) to `loggers`."""
    sets = ["train.log_interval=5", f"train.loggers={loggers}", *sets]
    return run_cli(*train_cli(corpus, run, steps=40, sets=sets), env=env, check=True)


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory, corpus):
    """The one run of the suite that logs to TensorBoard, trained once for all the tests that read it: they are all in
    this module, whose tests share a worker (--dist loadscope). TensorBoard is turned on by the older switch,
    train.tensorboard=true, beside a loggers list that does not name it."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    run = tmp_path_factory.mktemp("tensorboard") / "r"
    _train(run, corpus, "[jsonl,csv]", "train.tensorboard=true")
    return run


def test_jsonl_writes_steps_evaluations_and_the_summary(tmp_path, corpus):
    _train(tmp_path / "r", corpus, "[jsonl]")
    steps = [json.loads(line) for line in (tmp_path / "r" / "steps.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(5, 41, 5)) and all(s["step_loss"] > 0 for s in steps)
    assert [e["step"] for e in evals] == [10, 20, 30, 40] and all("val_loss" in e for e in evals)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["full_val_loss"] > 0


def test_csv_has_one_row_per_log(tmp_path, corpus):
    _train(tmp_path / "r", corpus, "[jsonl,csv]")
    rows = list(csv.DictReader((tmp_path / "r" / "metrics.csv").open()))
    kinds = [r["kind"] for r in rows]
    assert kinds.count("step") == 8 and kinds.count("eval") == 4 and kinds[-1] == "summary"
    assert float(rows[-1]["full_val_loss"]) > 0 and all(float(r["lr"]) > 0 for r in rows if r["kind"] != "summary")
    run_cli(*train_cli(out=tmp_path / "r", resume=True, steps=50), check=True)  # appends, one header
    again = list(csv.DictReader((tmp_path / "r" / "metrics.csv").open()))
    assert len(again) > len(rows) and sum(r["kind"] == "kind" for r in again) == 0


def test_tensorboard_event_files_parse_with_tensorboards_reader(tensorboard_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tensorboard_run / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"val_loss", "train_loss", "train/step_loss", "train/lr", "summary/full_val_loss"} <= set(scalars)
    assert [e.step for e in events.Scalars("val_loss")] == [10, 20, 30, 40]
    assert len(events.Scalars("train/step_loss")) == 8
    assert (tensorboard_run / "metrics.csv").is_file()


def test_the_older_tensorboard_switch_still_works(tensorboard_run):
    import yaml

    train = yaml.safe_load((tensorboard_run / "config.yaml").read_text())["train"]
    assert train["tensorboard"] and "tensorboard" not in train["loggers"]  # the switch alone turned it on
    assert any((tensorboard_run / "tensorboard").iterdir())


def test_wandb_in_offline_mode(tmp_path, corpus):
    pytest.importorskip("wandb", reason='the wandb extra is not installed (pip install -e ".[wandb]")')
    _train(
        tmp_path / "r",
        corpus,
        "[jsonl,wandb]",
        "train.wandb_project=charlm-tests",
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    runs = list((tmp_path / "r" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


@pytest.mark.parametrize(
    "name,setting",
    [
        ("wandb", "train.loggers=[jsonl,wandb]"),
        ("tensorboard", "train.loggers=[jsonl,tensorboard]"),
        ("tensorboard", "train.tensorboard=true"),  # the older switch
    ],
)
def test_a_missing_logger_package_is_one_line_before_training(tmp_path, corpus, monkeypatch, name, setting):
    # Whether or not the package is installed here, make importing it fail as it does where it is not:
    # None in sys.modules is Python's own "this module cannot be imported".
    for module in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, name, None)
    result = run_cli(*train_cli(corpus, tmp_path / "r", sets=[setting]))
    assert_one_line_error(result, 2, f'pip install -e ".[{name}]"')
    assert not (tmp_path / "r").exists()


def test_an_unknown_logger_names_the_key(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", sets=["train.loggers=[jsonl,mlflow]"]))
    assert_one_line_error(result, 2, "train.loggers", "mlflow")
