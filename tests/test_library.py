"""charlm as a library: training from Python leaves the process as it found it; the schedule on its own."""

import math
import re
import signal

import pytest
from conftest import REPO, callers_signal_handlers, handlers_are

import charlm
from charlm.config.build import load_config
from charlm.config.schema import TrainConfig
from charlm.training.run import run_training
from charlm.training.schedule import LRSchedule

TINY = [
    "model.n_layer=1",
    "model.n_embd=32",
    "model.block_size=16",
    "train.eval_interval=10",
    "train.eval_windows=16",
    "train.max_steps=20",
]


def test_training_from_python_leaves_the_signal_handlers_as_it_found_them(tmp_path, corpus):
    with callers_signal_handlers() as mine:
        summary = run_training(load_config("tiny", TINY + [f"data.path={corpus}"]), tmp_path / "run", quiet=True)
        assert summary.steps == 20
        assert handlers_are(mine)


def test_the_default_handlers_are_untouched_too(tmp_path, corpus):
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    run_training(load_config("tiny", TINY + [f"data.path={corpus}"]), tmp_path / "run", quiet=True)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_only_the_command_lines_signal_module_may_exit_the_process():
    """The library never calls os._exit or sys.exit; the command line's modules (signals.py, cli.py, cli_support.py)
    are the exceptions, and nothing the library imports pulls signals.py in."""
    for path in sorted((REPO / "charlm").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name in ("signals.py", "cli.py", "cli_support.py", "__main__.py"):
            continue
        assert not re.search(r"\bos\._exit\(|\bsys\.exit\(", text), path.name
        assert not re.search(
            r"^\s*(from charlm\.signals|from charlm import signals|import charlm\.signals)", text, re.M
        ), path.name


def test_a_keyboard_interrupt_in_python_saves_last_pt_and_propagates(tmp_path, corpus, monkeypatch):
    from charlm.training.step import OptimizerStep

    real_step, calls = OptimizerStep.step, []

    def interrupted_on_the_fifth_step(self, *args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_step(self, *args)

    monkeypatch.setattr(OptimizerStep, "step", interrupted_on_the_fifth_step)
    config = load_config("tiny", TINY + [f"data.path={corpus}", "train.max_steps=1000"])
    with pytest.raises(KeyboardInterrupt):
        run_training(config, tmp_path / "run", quiet=True)
    from charlm.storage.checkpoint import load_checkpoint

    assert load_checkpoint(tmp_path / "run" / "last.pt").step == 4


def _schedule(**keys) -> LRSchedule:
    return LRSchedule(TrainConfig(**{"lr": 1e-2, "min_lr": 1e-4, "max_steps": 100, **keys}))


def test_warmup_rises_linearly_to_the_peak():
    s = _schedule(warmup_steps=10, lr_schedule="cosine")
    assert [round(s.lr(step, 0.0), 6) for step in (0, 4, 9)] == [0.001, 0.005, 0.01]


def test_cosine_and_linear_decay_to_min_lr_over_the_nearer_budget():
    cosine = _schedule(lr_schedule="cosine")
    assert cosine.lr(0, 0.0) == pytest.approx(1e-2) and cosine.lr(100, 0.0) == pytest.approx(1e-4)
    assert cosine.lr(50, 0.0) == pytest.approx(1e-4 + (1e-2 - 1e-4) / 2)
    timed = _schedule(lr_schedule="linear", max_steps=0, max_seconds=10.0)
    assert timed.lr(3, 5.0) == pytest.approx(1e-4 + (1e-2 - 1e-4) / 2)  # elapsed time, not steps, decides
    both = _schedule(lr_schedule="linear", max_steps=100, max_seconds=10.0)
    assert both.lr(80, 5.0) == pytest.approx(1e-4 + (1e-2 - 1e-4) * 0.2)  # whichever is nearer to done


def test_wsd_holds_the_peak_then_decays_linearly_over_the_budgets_last_share():
    wsd = _schedule(lr_schedule="wsd", warmdown=0.4, warmup_steps=10, min_lr=0.0)
    assert wsd.lr(4, 0.0) == pytest.approx(5e-3)  # the warmup is the other schedules'
    assert wsd.lr(10, 0.0) == pytest.approx(1e-2) and wsd.lr(60, 0.0) == pytest.approx(1e-2)  # held to 60%
    assert wsd.lr(80, 0.0) == pytest.approx(5e-3) and wsd.lr(100, 0.0) == pytest.approx(0.0)
    timed = _schedule(lr_schedule="wsd", warmdown=0.5, max_steps=0, max_seconds=10.0)
    assert timed.lr(3, 7.5) == pytest.approx(1e-4 + (1e-2 - 1e-4) / 2)  # elapsed time decides, as for linear
    assert "held, then linear decay to 0.0001 over the last 50% of 10 s" in timed.describe()


def test_the_plateau_rule_lowers_the_lr_after_more_than_patience_stalled_checks():
    s = _schedule(lr_schedule="plateau", plateau_patience=2, plateau_factor=0.5)
    assert not s.observe(2.0, step=10)
    assert [s.observe(2.0, step=10 + i) for i in range(3)] == [False, False, True]
    assert s.lr(50, 0.0) == pytest.approx(5e-3)
    assert not s.observe(1.0, step=60) and s.plateau.best == 1.0


def test_the_plateau_rule_never_goes_below_min_lr_and_ignores_warmup():
    s = _schedule(lr_schedule="plateau", plateau_patience=0, plateau_factor=0.1, warmup_steps=5)
    assert not s.observe(3.0, step=2) and s.plateau.best == math.inf  # during warmup: nothing counted
    for i in range(10):
        s.observe(3.0, step=10 + i)
    assert s.lr(50, 0.0) == pytest.approx(1e-4)


def test_the_plateau_state_round_trips_and_reads_torch_reduce_on_plateau_state():
    s = _schedule(lr_schedule="plateau", plateau_patience=0)
    s.observe(2.0, 1)
    s.observe(2.0, 2)
    again = _schedule(lr_schedule="plateau", plateau_patience=0)
    again.load_state_dict(s.state_dict(), current_lr=123.0)
    assert again.plateau == s.plateau
    old = _schedule(lr_schedule="plateau")
    old.load_state_dict({"best": 1.5, "num_bad_epochs": 2, "factor": 0.5}, current_lr=2.5e-3)
    assert (old.plateau.best, old.plateau.bad_checks, old.lr(50, 0.0)) == (1.5, 2, 2.5e-3)


def test_the_package_says_its_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", charlm.__version__)


# -- the plateau rule and early stopping in real runs (a tiny lr keeps the validation loss flat) ------------------

FLAT = [
    "train.lr=1e-12",
    "train.min_lr=0",
    "train.warmup_steps=0",
    "train.eval_interval=5",
    "train.lr_schedule=plateau",
]


def _cli_train(run, corpus, *sets, **options):
    """`charlm train` of SMALL with FLAT's settings, then `sets`; the same command with resume=True continues it."""
    from conftest import SMALL, run_cli, train_cli

    return run_cli(*train_cli(corpus, run, config=SMALL, sets=[*FLAT, *sets], **options), check=True)


def _lrs(run):
    import json

    return [(m["step"], m["lr"]) for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def test_plateau_halves_the_lr_after_patience_stalled_checks_and_survives_resume(tmp_path, corpus):
    # lr 1e-7: steps too small for the 1e-4 relative improvement the rule asks for, large enough to be lowered
    common = ("train.plateau_patience=1", "train.plateau_factor=0.5", "train.lr=1e-7")
    _cli_train(tmp_path / "straight", corpus, *common, steps=30)
    assert _lrs(tmp_path / "straight") == [(5, 1e-7), (10, 1e-7), (15, 5e-8), (20, 5e-8), (25, 2.5e-8), (30, 2.5e-8)]
    _cli_train(tmp_path / "split", corpus, *common, steps=10)
    _cli_train(tmp_path / "split", corpus, *common, steps=30, resume=True)
    assert _lrs(tmp_path / "split") == _lrs(tmp_path / "straight")


def test_early_stopping_ends_the_run_says_so_and_survives_resume(tmp_path, corpus):
    import json

    straight = _cli_train(tmp_path / "straight", corpus, "train.early_stop_patience=2", steps=100, json=True)
    assert json.loads(straight.stdout)["stop_reason"] == "early_stop" and json.loads(straight.stdout)["steps"] == 15
    _cli_train(tmp_path / "split", corpus, "train.early_stop_patience=2", steps=10)
    resumed = _cli_train(tmp_path / "split", corpus, "train.early_stop_patience=2", steps=100, resume=True)
    assert resumed.stdout.startswith("done (early_stop): 15 steps")
