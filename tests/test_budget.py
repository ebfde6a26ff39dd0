"""`charlm train --budget` and `charlm.train(budget=...)`: the duration parsed or refused, the rule's table (the 100 s
row is configs/cpu.yaml), read in compute for the machine's speed (given, or measured by the probe), the user's own
keys kept, and the header lines that say what was chosen. tests/conftest.py gives every test the reference speed."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from conftest import REPO, assert_one_line_error, run_cli

from charlm.config.build import load_config
from charlm.config.sources import find_config
from charlm.training.budget import plan_budget
from charlm.training.budget_rule import TABLE, parse_budget, recipe_for, row_for, split_characters
from charlm.training.probe import MOST_PROBE_SECONDS, Speed
from charlm.training.run import resolve_run

TINY_SHAKESPEARE_TRAIN_CHARS = 1_115_394 - 111_539  # the whole file less its 10% validation split
# For runs that only show what the rule chose: a few sampled windows and a short validation split, so that the
# rule's 256-character context is not scored over thousands of windows after its one step (keys the rule never sets).
BRIEF_SCORING = ["--set", "train.eval_windows=4", "--set", "data.val_size=1024"]


@pytest.mark.parametrize("text, seconds", [("300s", 300), ("10m", 600), ("1h", 3600), ("1.5h", 5400), (" 90s ", 90)])
def test_a_budget_is_a_number_and_a_unit(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["10", "10x", "-5m", "m", "", "1e3s", "ten minutes", "5s"])
def test_a_malformed_budget_is_refused_in_one_line(tmp_path, text):
    result = run_cli("train", "--budget", text, "--out-dir", tmp_path / "run")
    assert_one_line_error(result, 2, "--budget", repr(text))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", [["--max-seconds", "30"], ["--set", "train.max_seconds=30"]])
def test_a_budget_beside_an_explicit_time_limit_is_refused(tmp_path, flag):
    result = run_cli("train", "--budget", "10m", *flag, "--out-dir", tmp_path / "run")
    assert_one_line_error(result, 2, "--budget 10m sets train.max_seconds", flag[0], "keep one")


def test_a_budget_is_refused_for_a_resumed_run_and_another_family(tmp_path):
    assert_one_line_error(run_cli("train", "--budget", "10m", "--resume"), 2, "--budget", "resumed run")
    result = run_cli("train", "--budget", "10m", "--config", "g2p", "--out-dir", tmp_path / "run")
    assert_one_line_error(result, 2, "--budget", "decoder", "train.max_seconds yourself")


def test_the_100_s_row_is_the_default_recipe():
    """On tiny-shakespeare, every key configs/cpu.yaml sets (its corpus aside) is what the rule picks for 100 s."""
    shipped = yaml.safe_load(load_config("cpu").to_yaml())
    cpu_yaml = yaml.safe_load(find_config("cpu").read_text())
    recipe = recipe_for(100, TINY_SHAKESPEARE_TRAIN_CHARS)
    sections = {section: body for section, body in cpu_yaml.items() if section not in ("data", "base")}
    keys = [f"{section}.{key}" for section, body in sections.items() for key in body]
    assert len(keys) > 20
    assert {k: recipe[k] for k in keys} == {k: shipped[k.split(".")[0]][k.split(".")[1]] for k in keys}


def test_the_ten_minute_shape_sweep_fixes_the_rules_own_keys():
    """configs/sweeps/shape-10m.yaml restates the rule's 10-minute keys for tiny-shakespeare (a sweep spec cannot
    take --budget): they must stay the rule's, and its grid must hold the rule's own shape."""
    spec = yaml.safe_load((REPO / "configs" / "sweeps" / "shape-10m.yaml").read_text())
    rule = recipe_for(600, TINY_SHAKESPEARE_TRAIN_CHARS)
    assert spec["set"] == {key: rule[key] for key in spec["set"]}
    assert float(spec["budget"].removesuffix("s")) == rule["train.max_seconds"]
    for key in ("model.n_layer", "model.n_embd"):
        assert rule[key] in spec["params"][key]["choices"]


def test_the_rule_grows_the_model_with_the_budget_and_the_dropout_as_the_corpus_shrinks():
    depths = [row.depth for row in TABLE]
    assert depths == sorted(depths) and recipe_for(300, TINY_SHAKESPEARE_TRAIN_CHARS)["model.n_layer"] == 4
    ten_minutes, hour = recipe_for(600, 100_000_000), recipe_for(3600, 100_000_000)
    assert (ten_minutes["model.n_layer"], ten_minutes["model.n_embd"], ten_minutes["model.n_head"]) == (5, 128, 4)
    assert (hour["model.n_layer"], hour["model.n_embd"], hour["model.n_head"]) == (6, 160, 5)
    assert hour["train.lr"] < ten_minutes["train.lr"] < recipe_for(100, 100_000_000)["train.lr"]
    assert hour["model.dropout"] == hour["train.muon_weight_decay"] == 0.0  # 100 MB: gone over a few times at most
    # On 1 MB, by the measurements behind the rule: no dropout but Muon's weight decay 0.3 at 2 and 5 minutes, dropout
    # 0.1 at 10 minutes, 0.2 at an hour, each with Muon's weight decay 0.1.
    regularisation = {
        budget: (recipe["model.dropout"], recipe["train.muon_weight_decay"])
        for budget in (120, 300, 600, 3600)
        for recipe in [recipe_for(budget, TINY_SHAKESPEARE_TRAIN_CHARS)]
    }
    assert regularisation == {120: (0.0, 0.3), 300: (0.0, 0.3), 600: (0.1, 0.1), 3600: (0.2, 0.1)}
    assert ten_minutes["train.max_seconds"] == 570 and hour["train.max_seconds"] == 3540
    # Over 5 minutes, context 256 at the default's 2,048 characters a step; up to 5 minutes, the default's 128.
    for recipe, context in ((recipe_for(300, 100_000_000), 128), (ten_minutes, 256), (hour, 256)):
        assert (recipe["model.block_size"], recipe["train.batch_size"]) == (context, 2048 // context)


def test_a_context_of_the_user_s_own_keeps_the_characters_a_step(tmp_path, corpus):
    rule = recipe_for(600, TINY_SHAKESPEARE_TRAIN_CHARS, {"model.block_size": 512})
    assert rule["train.batch_size"] == 4
    assert recipe_for(600, TINY_SHAKESPEARE_TRAIN_CHARS, {"model.block_size": 4096})["train.batch_size"] == 1
    runs = {
        "set-context": ["--set", "model.block_size=64"],  # the batch follows it: 32 x 64
        "set-batch": ["--set", "train.batch_size=4"],  # kept, beside the rule's context
        "file": ["--config", "tiny"],  # a config file's context and batch are the user's: both kept
    }
    for name, args in runs.items():
        run_cli(
            "train",
            "--budget",
            "10m",
            *args,
            "--data",
            corpus,
            "--out-dir",
            tmp_path / name,
            "--max-steps",
            1,
            *BRIEF_SCORING,
            "--quiet",
            check=True,
        )
    shapes = {name: load_config(tmp_path / name / "config.yaml") for name in runs}
    assert {name: (c.model.block_size, c.train.batch_size) for name, c in shapes.items()} == {
        "set-context": (64, 32),
        "set-batch": (256, 4),
        "file": (32, 16),
    }


def test_the_user_keys_win_and_the_header_line_says_what_was_chosen(tmp_path, corpus):
    run = tmp_path / "run"
    args = ["--budget", "10m", "--data", corpus, "--out-dir", run, "--set", "model.n_layer=1", "--max-steps", 2]
    result = run_cli("train", *args, "--json", check=True)
    speed, header = result.stderr.splitlines()[:2]
    assert speed == (
        "26k chars/s for the 4 x 96 reference here (CHARLM_SPEED): 10m here buys what 10 min buys on the 2-core CPU "
        "the rule was measured on"
    )
    assert header.startswith("budget 10m: 570 s of training; for budgets up to 20 min of the reference CPU"), header
    assert "1 layer x 128 wide, 4 heads, context 256 x batch 8, dropout 0.2 outside attention" in header
    assert "outside attention, Muon weight decay 0.1 (" in header
    assert header.endswith("yours kept: model.n_layer=1, train.max_steps=2")
    config = load_config(run / "config.yaml")
    assert (config.model.n_layer, config.model.n_embd, config.model.n_head, config.model.dropout) == (1, 128, 4, 0.2)
    assert (config.model.block_size, config.train.batch_size) == (256, 8)
    assert (config.train.max_seconds, config.train.max_steps, config.train.lr) == (570, 2, 0.0043)
    assert config.model.attention_dropout == 0.0  # the fused attention kernel kept: dropout in the residual stream
    assert config.train.muon_weight_decay == 0.1  # with dropout: the run goes over its corpus many times
    assert json.loads(result.stdout)["steps"] == 2


def test_a_config_file_s_keys_are_the_user_s_but_its_limits_are_the_budget_s(tmp_path, corpus):
    run = tmp_path / "run"
    args = ["--budget", "5m", "--config", "tiny", "--data", corpus, "--out-dir", run, "--max-steps", 2, "--quiet"]
    run_cli("train", *args, check=True)
    config = load_config(run / "config.yaml")
    assert (config.model.n_layer, config.model.n_embd, config.train.lr) == (2, 64, 3e-3)  # tiny.yaml's, kept
    assert (config.model.token_shift, config.train.optimizer) == (True, "muon")  # the rule's, tiny.yaml sets none
    assert (config.train.max_seconds, config.train.max_steps) == (285, 2)


def test_the_python_api_takes_a_budget(tmp_path, corpus):
    import charlm

    overrides = {"model.n_layer": 1, "train.max_steps": 2, "train.eval_windows": 4, "data.val_size": 1024}
    summary = charlm.train(overrides=overrides, data=corpus, out_dir=tmp_path / "run", quiet=True, budget="1h")
    config = load_config(tmp_path / "run" / "config.yaml")
    assert summary["steps"] == 2 and (config.model.n_layer, config.model.n_embd, config.train.max_seconds) == (
        1,
        160,
        3540,
    )


def test_a_dropout_of_the_users_own_keeps_its_reach(tmp_path, corpus):
    """The rule keeps its own dropout out of attention weights; one the user sets is left to act where it did."""
    args = ["--budget", "10m", "--data", corpus, "--max-steps", 1, "--set", "model.n_layer=1", *BRIEF_SCORING, "-q"]
    run_cli("train", *args, "--out-dir", tmp_path / "mine", "--set", "model.dropout=0.3", check=True)
    mine = load_config(tmp_path / "mine" / "config.yaml").model
    assert (mine.dropout, mine.attention_dropout) == (0.3, None)
    both = ["--set", "model.dropout=0.1", "--set", "model.attention_dropout=0"]  # both the user's: both kept
    run_cli("train", *args, "--out-dir", tmp_path / "both", *both, check=True)
    both_kept = load_config(tmp_path / "both" / "config.yaml").model
    assert (both_kept.dropout, both_kept.attention_dropout) == (0.1, 0.0)
    run_cli("train", *args, "--out-dir", tmp_path / "rule", check=True)
    rule = load_config(tmp_path / "rule" / "config.yaml").model
    assert rule.dropout > 0 and rule.attention_dropout == 0.0


def test_a_small_corpus_shortens_the_rule_s_context_to_fit_its_validation_split(tmp_path, corpus):
    """2,000 characters hold back 200 for validation: no window of 256 (the 10-minute row's context) fits there, 128
    does, and the header says why; a context the user gives is theirs, and a corpus too small for any window is
    refused in one line as without a budget."""
    text = corpus.read_text()
    small, tiny = tmp_path / "small.txt", tmp_path / "tiny.txt"
    small.write_text(text[:2000])
    tiny.write_text(text[:100])
    args = ["train", "--budget", "10m", "--max-steps", 1, "--set", "model.n_layer=1"]
    result = run_cli(*args, "--data", small, "--out-dir", tmp_path / "small", "--json", check=True)
    header = result.stderr.splitlines()[1]  # after the speed's line
    assert "context 128 (the 200-character validation split holds no window of 256) x batch 16" in header, header
    config = load_config(tmp_path / "small" / "config.yaml")
    assert (config.model.block_size, config.train.batch_size) == (128, 16)
    run_cli(*args, "--data", small, "--out-dir", tmp_path / "mine", "--set", "model.block_size=64", check=True)
    assert load_config(tmp_path / "mine" / "config.yaml").model.block_size == 64
    result = run_cli(*args, "--data", tiny, "--out-dir", tmp_path / "tiny", "--quiet")
    assert_one_line_error(result, 2, "too short", "validation split has 10 tokens", "model.block_size", "data.val_size")
    assert recipe_for(600, 1_800, val_chars=100)["model.block_size"] == 64  # halved until a window fits


def test_the_user_s_keys_are_checked_beside_the_rule_s_shape_not_the_default_s(tmp_path, corpus):
    """128 wide goes with the rule's 4 heads at 10 minutes (the default config's 3 would refuse it); a key of the
    user's that disagrees with the rule's is refused naming what the rule chose."""
    args = ("--data", corpus, "--max-steps", 1, *BRIEF_SCORING, "--quiet")
    run_cli("train", "--budget", "10m", "--set", "model.n_embd=128", *args, "--out-dir", tmp_path / "a", check=True)
    model = load_config(tmp_path / "a" / "config.yaml").model
    assert (model.n_layer, model.n_head, model.n_embd) == (5, 4, 128)
    refused = run_cli("train", "--budget", "10m", "--set", "model.n_embd=100", *args, "--out-dir", tmp_path / "b")
    assert_one_line_error(refused, 2, "n_embd / n_head = 25", "--budget 10m chose model.n_head=4", "--set")
    typo = run_cli("train", "--budget", "10m", "--set", "model.n_heads=2", *args, "--out-dir", tmp_path / "c")
    assert_one_line_error(typo, 2, "did you mean 'model.n_head'")
    assert "--budget 10m chose" not in typo.stderr  # a typo is not the rule's doing
    assert not (tmp_path / "b").exists()


def _budget_run(tmp_path, corpus, name, *extra):
    run = tmp_path / name
    args = ["train", "--budget", "10m", "--data", corpus, "--out-dir", run, "--max-steps", 1, *BRIEF_SCORING]
    result = run_cli(*args, *extra, check=True)
    return result.stderr.splitlines(), load_config(run / "config.yaml"), json.loads((run / "budget.json").read_text())


def test_the_speed_given_sets_what_the_budget_buys(tmp_path, corpus):
    """Half the reference CPU's speed, its own, and fifty times it (a GPU's order): ten minutes buy the 5-minute
    row's 4 layers, the 10-minute row's 5, and 9 layers from the compute-scaled rows; budget.json keeps the speed."""
    picks = {}
    for speed in ("13k", "26000", "1.3M"):
        said, config, record = _budget_run(tmp_path, corpus, speed, "--speed", speed)
        assert said[0].endswith("on the 2-core CPU the rule was measured on") and "(--speed)" in said[0], said
        assert record["speed"]["source"] == "--speed" and record["depth"] == config.model.n_layer
        picks[speed] = (config.model.n_layer, config.model.n_embd, config.model.block_size)
    assert picks == {"13k": (4, 96, 128), "26000": (5, 128, 256), "1.3M": (9, 224, 256)}


def test_the_rule_says_when_it_hits_its_cap():
    assert [row_for(600, speed).depth for speed in (26_000, 26_000 * 50, 26_000 * 10**4)] == [5, 9, 12]
    assert math.isinf(row_for(600, 26_000 * 10**4).up_to_s) and row_for(600, 26_000 * 10**5).depth == 12
    speed = Speed(26_000 * 10**4, "--speed")
    request = plan_budget("10m", None, [], {}, speed)
    recipe = recipe_for(600, 10**6, speed=speed.chars_per_s)
    config = load_config("cpu", [], {key: ("--budget", value) for key, value in recipe.items()})
    assert config.model.n_layer == 12 and "the table's deepest row, its cap" in request.describe(
        config, (10**6, 10**5), []
    )


def test_the_speed_is_measured_when_none_is_given(tmp_path, corpus, monkeypatch):
    monkeypatch.delenv("CHARLM_SPEED")
    monkeypatch.setattr("charlm.training.probe.TIMED_SECONDS", 0.5)  # a speed measured, not a precise one: briefly
    said, config, record = _budget_run(tmp_path, corpus, "measured")
    assert " (measured in " in said[0] and "threads" in said[0], said
    probe = record["speed"]
    assert probe["source"] == "measured" and probe["chars_per_s"] > 0 and 0 < probe["seconds"] < MOST_PROBE_SECONDS + 5
    assert config.train.max_seconds < 570  # the probe's seconds came out of training's share


def test_a_budget_too_small_for_the_probe_and_a_bad_speed_are_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("CHARLM_SPEED")
    out = ["--out-dir", tmp_path / "run"]
    assert_one_line_error(run_cli("train", "--budget", "20s", *out), 2, "--budget 20s", "--speed", "at least 30s")
    for bad in ("0", "-5", "fast", "nan", "inf"):
        assert_one_line_error(run_cli("train", "--budget", "1m", "--speed", bad, *out), 2, f"--speed {bad!r}")
    monkeypatch.setenv("CHARLM_SPEED", "slow")
    assert_one_line_error(run_cli("train", "--budget", "1m", *out), 2, "CHARLM_SPEED 'slow' is not a speed")
    assert_one_line_error(run_cli("train", "--config", "cpu", "--speed", "31k", *out), 2, "give --budget too")
    assert not (tmp_path / "run").exists()


def test_the_users_keys_are_checked_beside_the_row_the_speed_picks(tmp_path, corpus):
    """Three heads fit the reference speed's 2-minute row (96 wide); ten times the speed picks 20 minutes' 128 wide,
    and the refusal names what the rule chose for that speed."""
    args = ["train", "--budget", "2m", "--set", "model.n_head=3", "--data", corpus, "--max-steps", 1, *BRIEF_SCORING]
    run_cli(*args, "--out-dir", tmp_path / "slow", "-q", check=True)
    fast = run_cli(*args, "--speed", "260k", "--out-dir", tmp_path / "fast")
    assert_one_line_error(fast, 2, "--budget 2m chose model.n_embd=128", "--set")


def test_a_gpus_speed_reads_in_millions_and_torchrun_must_give_one(tmp_path, monkeypatch):
    assert Speed(1.3e6, "--speed").words().startswith("1.3M chars/s for the 4 x 96 reference here")
    monkeypatch.delenv("CHARLM_SPEED")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = run_cli("train", "--budget", "10m", "--out-dir", tmp_path / "run")
    assert_one_line_error(result, 2, "--budget under torchrun needs --speed")


def _plain_run(tmp_path, corpus, sets=(), **options):
    """What `charlm train --data CORPUS [--set ...] [options]` would train, and what its header says, without
    training: the run's request resolved as the command resolves it, then its budget's recipe picked."""
    flags = {"data.path": ("--data", str(corpus))} | {k: (f"--{k.split('.')[1]}", v) for k, v in options.items()}
    request = resolve_run(None, list(sets), flags, tmp_path / "run")
    said: list[str] = []
    return request, (request.budget.config(said.append) if request.budget else request.config), said


def test_plain_charlm_train_is_the_rule_at_100_s_and_configs_cpu_yaml_at_the_reference_speed(tmp_path, corpus):
    """At the speed of the CPU the rule was measured on, plain `charlm train` trains configs/cpu.yaml's recipe; a
    machine ~30% slower (one thread of it) gets the 2-layer row, and a GPU's speed a deeper model. A limit, a config
    file or torchrun without a speed keep configs/cpu.yaml's own recipe."""
    cpu_yaml = load_config("cpu", [f"data.path={corpus}"]).flat()
    request, config, said = _plain_run(tmp_path, corpus)
    assert request.budget is not None and request.budget.text == "100s"
    mine = config.flat()
    shape = ["model.n_layer", "model.n_embd", "model.n_head", "model.block_size", "train.batch_size", "train.lr"]
    assert {k: mine[k] for k in shape} == {k: cpu_yaml[k] for k in shape}
    # the rest is the rule's for this small corpus (more regularised than tiny-shakespeare's, which is cpu.yaml's)
    chars, val_chars = split_characters(config)
    recipe = recipe_for(100, chars, val_chars=val_chars)
    assert {k: mine[k] for k in recipe if k != "train.max_seconds"} == {
        k: v for k, v in recipe.items() if k != "train.max_seconds" and v is not None
    } | {k: mine[k] for k, v in recipe.items() if v is None}
    assert "100s here buys what 100 s buys" in said[0] and said[1].startswith("budget 100s: 95 s of training")
    picks = {}
    for speed in ("19k", "26k", "1.3M"):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("CHARLM_SPEED", speed)
            model = _plain_run(tmp_path, corpus)[1].model
        picks[speed] = (model.n_layer, model.n_embd)
    assert picks == {"19k": (2, 96), "26k": (3, 96), "1.3M": (7, 192)}
    assert _plain_run(tmp_path, corpus, **{"train.max_steps": 5})[0].budget is None
    assert _plain_run(tmp_path, corpus, ["train.max_seconds=30"])[0].budget is None
    assert resolve_run("cpu", [], {}, tmp_path / "run").budget is None
    assert resolve_run(None, [], {}, tmp_path / "run", resume=True).budget is None  # the run keeps its recipe
    assert resolve_run(None, [], {}, tmp_path / "run", init_from=tmp_path / "source").budget is None
    pairs = ["data.format=pairs", "model.arch=encoder-decoder"]  # another family: configs/cpu.yaml with its settings
    assert resolve_run(None, pairs, {}, tmp_path / "run").budget is None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WORLD_SIZE", "2")
        env.delenv("CHARLM_SPEED")
        assert _plain_run(tmp_path, corpus)[0].budget is None


# A process that may hold little more memory than it has once torch is imported (RLIMIT_AS), probed at a batch far
# beyond that: the allocations really fail, as a GPU's do when its memory is full.
OUT_OF_MEMORY_PROBE = """
import json, resource, sys
import charlm.training.probe as probe
from charlm.config.build import load_config

probe.REFERENCE_BATCH = 256  # the probe's first batch: far more than the limit below lets it allocate
probe.MOST_PROBE_SECONDS = 1.0  # the speed itself is not under test: the shortest probe, one timed step
status = open("/proc/self/status").read()
size = int(next(line for line in status.splitlines() if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + 400 * 2**20, size + 400 * 2**20))
said = []
# torch's own linear kernels: oneDNN's say "could not create a primitive" when memory runs out, which is not only that
speed = probe.measure_speed(load_config("cpu", ["train.cpu_linear=torch"]), said.append)
print(json.dumps({"note": speed.note, "said": said, "chars_per_s": speed.chars_per_s}))
"""


@pytest.mark.process
def test_a_probe_out_of_memory_falls_back_to_smaller_batches_and_says_so():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY_PROBE], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["said"][0] == "speed probe: batch 256 ran out of memory, trying batch 128"
    measured = int(out["note"].rsplit(" ", 1)[1])
    assert out["note"] == f"batch 256 ran out of memory, measured at batch {measured}" and 1 <= measured < 256
    assert len(out["said"]) == math.log2(256 // measured)  # one line for each halving, none after the one that ran
    assert out["chars_per_s"] > 0
