"""Configs that build on others: a user's file changes only what it sets of the default recipe, `base:` chains are
followed (names, paths beside the file, run folders), cycles, missing bases and pickles are refused in one line, and
`charlm config` names where each key's value came from."""

import json
import pickle
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, run_cli

from charlm.config.build import load_config
from charlm.config.origins import key_origins
from charlm.config.schema import Config, shipped_config_names
from charlm.errors import UsageError
from charlm.training.budget import plan_budget


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_shipped_config_resolves_as_it_did_when_its_figures_were_measured():
    """tests/data/shipped-configs-resolved.json holds each shipped config resolved before configs could build on
    others: every benchmark's command names one of them, so each must still mean exactly that."""
    before = json.loads((REPO / "tests/data/shipped-configs-resolved.json").read_text())
    assert set(before) <= set(shipped_config_names())  # none gone (configs added since resolve as they are)
    for name, values in before.items():
        assert load_config(name).flat() == values, name


def test_a_users_two_key_file_is_the_default_recipe_with_those_keys_changed(tmp_path):
    mine = _write(tmp_path / "my.yaml", "train:\n  max_seconds: 60\nmodel:\n  n_layer: 4\n")
    expected = load_config("cpu").flat() | {"train.max_seconds": 60.0, "model.n_layer": 4}
    assert load_config(mine).flat() == expected
    assert expected != Config().flat()  # the recipe is not the built-in defaults, so this checks something

    shown = run_cli("config", "--config", mine, check=True).stdout
    assert yaml.safe_load(shown) == load_config(mine).to_dict()  # still YAML that loads back to the config
    lines = {line.split(":")[0].strip(): line for line in shown.splitlines() if not line.startswith(("#", " " * 4))}
    assert lines["max_seconds"].endswith(f"# {mine}") and lines["n_layer"].endswith(f"# {mine}")
    assert lines["optimizer"].endswith("# configs/cpu.yaml") and lines["muon_momentum"].endswith("# default")
    assert f"configs/cpu.yaml <- {mine}" in shown


def test_origins_name_the_last_file_or_option_that_set_each_key(tmp_path):
    _write(tmp_path / "root.yaml", "base: tiny\ntrain:\n  lr: 0.01\n  seed: 3\n")
    leaf = _write(tmp_path / "leaf.yaml", "base: root.yaml\ntrain:\n  seed: 4\n")  # found beside the naming file
    config, origins = key_origins(leaf, ["train.batch_size=8"], {"train.max_steps": ("--max-steps", 7)})
    assert (config.train.lr, config.train.seed, config.model.n_layer) == (0.01, 4, 2)
    assert origins["train.lr"] == str(tmp_path / "root.yaml") and origins["train.seed"] == str(leaf)
    assert origins["model.n_layer"] == "configs/tiny.yaml" and origins["model.n_head"] == "configs/tiny.yaml"
    assert origins["train.batch_size"] == "--set train.batch_size=8" and origins["train.max_steps"] == "--max-steps"
    assert origins["model.token_shift"] == "default"  # tiny builds on the built-in defaults, not on the recipe


def test_a_run_folder_is_a_base_and_a_config(tmp_path):
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(load_config("tiny", ["model.n_embd=48"]).to_yaml())
    child = _write(tmp_path / "child.yaml", f"base: {run}\ntrain:\n  max_steps: 5\n")
    assert load_config(child).model.n_embd == 48 and load_config(child).train.max_steps == 5
    assert load_config(run).model.n_embd == 48  # --config runs/mine reads its config.yaml


def test_a_cycle_is_refused_naming_its_files(tmp_path):
    _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(UsageError) as e:
        load_config(tmp_path / "a.yaml")
    message = str(e.value)
    assert "cycle" in message and "a.yaml" in message and "b.yaml" in message and "\n" not in message
    itself = _write(tmp_path / "self.yaml", "base: self.yaml\n")
    with pytest.raises(UsageError, match="cycle"):
        load_config(itself)


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("nowhere.yaml", "its base 'nowhere.yaml' was not found"),
        ("[1, 2]", "base must name the config this one builds on"),
        ("''", "base must name the config this one builds on"),
    ],
)
def test_a_missing_or_malformed_base_is_one_line(tmp_path, base, expected):
    mine = _write(tmp_path / "my.yaml", f"base: {base}\n")
    result = run_cli("train", "--config", mine)
    assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_checkpoint_or_pickle_is_never_read_as_a_config(tmp_path):
    torch.save({"config": {}}, tmp_path / "best.pt")  # torch's zip archive, with a pickle inside
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"train": {"lr": 1}}))
    for given in ("best.pt", "plain.pkl"):
        mine = _write(tmp_path / "my.yaml", f"base: {given}\n")
        for named in (mine, tmp_path / given):  # as a base, and as the config itself
            result = run_cli("config", "--config", named)
            assert result.returncode == 2 and "is a checkpoint or pickle, not a YAML config" in result.stderr
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_budget_counts_a_users_keys_not_the_recipe_they_build_on(tmp_path):
    mine = _write(tmp_path / "my.yaml", "model:\n  n_layer: 4\n")
    user_keys = plan_budget("10m", str(mine), [], {}).user_keys
    assert set(user_keys) == {"model.n_layer"}  # not configs/cpu.yaml's keys, which the rule replaces


def test_a_split_file_outranks_the_fraction_of_the_config_below(tmp_path):
    (tmp_path / "dev.txt").write_text("abc\n")
    mine = _write(tmp_path / "mine.yaml", f"base: names\ndata:\n  val_path: {tmp_path / 'dev.txt'}\n")
    config, origins = key_origins(mine, [])
    assert config.data.val_path.endswith("dev.txt") and config.data.val_fraction == Config().data.val_fraction
    assert origins["data.val_fraction"] == "default" and origins["data.test_fraction"] == "configs/names.yaml"
    both = _write(
        tmp_path / "both.yaml", f"base: names\ndata:\n  val_path: {tmp_path / 'dev.txt'}\n  val_fraction: 0.2\n"
    )
    with pytest.raises(UsageError, match="both choose the val split"):  # set at one level, they still disagree
        load_config(both)


def test_a_run_folder_named_like_a_shipped_config_never_stands_in_for_it(tmp_path):
    (tmp_path / "cpu").mkdir()  # runs/cpu seen from runs/: a run folder called cpu in the current folder
    (tmp_path / "cpu" / "config.yaml").write_text(load_config("tiny").to_yaml())
    _write(tmp_path / "mine.yaml", "train:\n  seed: 3\n")
    shown = run_cli("config", "--config", "mine.yaml", cwd=tmp_path, check=True).stdout
    assert "configs/cpu.yaml <- mine.yaml" in shown and yaml.safe_load(shown)["model"]["n_layer"] == 3
    assert load_config(tmp_path / "cpu").model.n_layer == 2  # named by its path, it is the run's
