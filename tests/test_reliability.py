"""Nothing lost, nothing executed, every bad input answered clearly (docs/reliability.md lists each guarantee)."""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import stat
import warnings
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, run_cli, train_cli

from charlm.config.build import load_config
from charlm.errors import UsageError, WorkError
from charlm.files import atomic_write
from charlm.hardware.device import require_torch
from charlm.storage import checkpoint as ckpt_module
from charlm.storage.checkpoint import load_checkpoint, save_checkpoint
from charlm.training.run import run_training


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


# 1. Interrupted save ---------------------------------------------------------------------------------------------


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def _good_checkpoint(path: Path) -> bytes:
    config = load_config("tiny", ["model.n_layer=1", "model.n_embd=16", "model.n_head=2"])
    from charlm.models.decoder import Decoder

    model = Decoder(config.model, 5)
    save_checkpoint(path, {"config": config.to_dict(), "vocab": list("abcde"), "model": model.state_dict(), "step": 1})
    return path.read_bytes()


def test_a_save_whose_pickling_fails_leaves_the_previous_checkpoint(tmp_path):
    before = _good_checkpoint(tmp_path / "last.pt")
    with pytest.raises(RuntimeError, match="cannot pickle"):
        save_checkpoint(tmp_path / "last.pt", {"config": {}, "vocab": [], "model": Unpicklable(), "step": 2})
    assert (tmp_path / "last.pt").read_bytes() == before and load_checkpoint(tmp_path / "last.pt").step == 1
    assert _temp_files(tmp_path) == []


def test_a_state_on_the_cpu_is_saved_as_it_is():
    """on_cpu moves a GPU run's tensors to the host (tests/test_gpu.py checks it there); a CPU run's state, containers
    and all, goes to torch.save untouched: no copy of the weights, and a state_dict keeps its _metadata."""
    from collections import OrderedDict

    from charlm.storage.checkpoint import on_cpu

    weights = OrderedDict(w=torch.ones(2, 2))
    weights._metadata = OrderedDict({"": {"version": 1}})  # as Module.state_dict sets it
    optimizer = {"state": {0: {"exp_avg": torch.zeros(2, 2)}}, "param_groups": [{"betas": (0.9, 0.99), "params": [0]}]}
    state = {"model": weights, "optimizer": optimizer, "ranks": [{"rng": torch.get_rng_state()}], "step": 3}
    assert on_cpu(state) is state


def test_a_write_failing_with_enospc_leaves_the_previous_file(tmp_path):
    before = _good_checkpoint(tmp_path / "last.pt")

    def write_then_fill_the_disk(f):
        f.write(b"x" * 10_000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError):
        atomic_write(tmp_path / "last.pt", write_then_fill_the_disk)
    assert (tmp_path / "last.pt").read_bytes() == before and _temp_files(tmp_path) == []


# 10. Disk full during training -----------------------------------------------------------------------------------


def test_disk_full_during_training_stops_with_a_clear_error_and_keeps_the_last_checkpoint(
    tmp_path, corpus, monkeypatch
):
    config = load_config(
        "tiny",
        [
            "model.n_layer=1",
            "model.n_embd=32",
            "model.block_size=16",
            "train.eval_interval=5",
            "train.max_steps=40",
            f"data.path={corpus}",
        ],
    )
    real_save, calls = torch.save, []

    def save_until_the_disk_fills(obj, f):
        calls.append(1)
        if len(calls) > 2:  # best.pt and last.pt of the first evaluation succeed
            f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(obj, f)

    monkeypatch.setattr(ckpt_module.torch, "save", save_until_the_disk_fills)
    with pytest.raises(WorkError, match="No space left on device.*untouched"):
        run_training(config, tmp_path / "run", quiet=True)
    monkeypatch.setattr(ckpt_module.torch, "save", real_save)
    assert load_checkpoint(tmp_path / "run" / "last.pt").step == 5
    assert _temp_files(tmp_path / "run") == []
    # the command line says how to go on, in one line and exit 1
    calls.clear()
    monkeypatch.setattr(ckpt_module.torch, "save", save_until_the_disk_fills)
    sets = ["model.n_layer=1", "model.n_embd=32", "model.block_size=16", "train.eval_interval=5"]
    result = run_cli(*train_cli(corpus, tmp_path / "cli", steps=40, quiet=True, config="tiny", sets=sets))
    assert_one_line_error(result, 1, "No space left", f"`charlm train --resume --out-dir {tmp_path / 'cli'}`")


# 3. Exact resume -------------------------------------------------------------------------------------------------


def test_resume_is_exact_per_step_losses_and_final_weights(tmp_path, corpus):
    sets = ["train.eval_interval=1", "model.dropout=0.2"]
    run_cli(*train_cli(corpus, tmp_path / "straight", steps=16, quiet=True, sets=sets), check=True)
    run_cli(*train_cli(corpus, tmp_path / "split", steps=8, quiet=True, sets=sets), check=True)
    run_cli(*train_cli(out=tmp_path / "split", resume=True, steps=16, quiet=True), check=True)
    straight, split = _metrics(tmp_path / "straight"), _metrics(tmp_path / "split")
    assert [m["step"] for m in split] == list(range(1, 17))
    assert [m["step_loss"] for m in straight] == [m["step_loss"] for m in split]
    a = load_checkpoint(tmp_path / "straight" / "last.pt").state["model"]
    b = load_checkpoint(tmp_path / "split" / "last.pt").state["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# 5. Non-finite loss ----------------------------------------------------------------------------------------------


def test_a_nan_loss_stops_before_the_step_and_keeps_the_last_checkpoints(tmp_path, corpus, monkeypatch):
    from charlm.models.decoder import Decoder

    sets = ["model.n_layer=1", "model.n_embd=32", "model.block_size=16", "train.eval_interval=5", f"data.path={corpus}"]
    run = tmp_path / "run"
    run_training(load_config("tiny", sets + ["train.max_steps=10"]), run, quiet=True)
    before = {name: (run / name).read_bytes() for name in ("best.pt", "last.pt")}
    real_forward, calls = Decoder.forward, []

    def nan_on_the_third_step(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if targets is not None and self.training:
            calls.append(1)
            if len(calls) == 3:
                loss = loss * float("nan")  # injected: step 13 goes bad
        return logits, loss

    monkeypatch.setattr(Decoder, "forward", nan_on_the_third_step)
    with pytest.raises(WorkError, match="loss became nan at step 13; training stopped before updating"):
        run_training(
            load_config("tiny", sets + ["train.max_steps=30"]),
            run,
            resume=True,
            resume_changes={"train.max_steps": 30},
            quiet=True,
        )
    assert {name: (run / name).read_bytes() for name in before} == before


def test_a_diverging_run_exits_1_naming_the_step_and_never_saves_non_finite_weights(tmp_path, corpus):
    run = tmp_path / "run"
    sets = ["train.lr=1e38", "train.grad_clip=0", "train.warmup_steps=0", "train.eval_interval=1"]
    diverged = run_cli(*train_cli(corpus, run, steps=40, quiet=True, sets=sets))
    assert_one_line_error(diverged, 1, "loss became", "at step")
    if (run / "last.pt").exists():
        saved = load_checkpoint(run / "last.pt")
        assert all(torch.isfinite(t).all() for t in saved.state["model"].values() if t.is_floating_point())


def test_a_checkpoint_with_non_finite_weights_is_refused(tmp_path):
    _good_checkpoint(tmp_path / "m.pt")
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    state["model"]["tok_emb.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "nan.pt")
    with pytest.raises(UsageError, match="non-finite"):
        load_checkpoint(tmp_path / "nan.pt").build_model()
    for command in ("sample", "eval", "info"):
        assert_one_line_error(run_cli(command, tmp_path / "nan.pt"), 2, "non-finite")


# 6. Hostile checkpoints ------------------------------------------------------------------------------------------


class RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_everywhere(tmp_path, corpus):
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    run_cli(*train_cli(corpus, run, steps=5), check=True)
    state = torch.load(run / "last.pt", weights_only=True)
    state["payload"] = RunsCode(marker)
    torch.save(state, run / "last.pt")
    torch.save(state, tmp_path / "evil.pt")
    for args in (
        train_cli(out=run, resume=True),
        ["eval", tmp_path / "evil.pt"],
        ["sample", tmp_path / "evil.pt"],
        ["info", tmp_path / "evil.pt"],
    ):
        assert_one_line_error(run_cli(*args), 2, "could run code")
    assert not marker.exists()


@pytest.mark.parametrize(
    "kind", ["truncated", "random", "text", "pickle", "empty", "not-a-dict", "format", "vocab", "shape"]
)
def test_broken_checkpoints_are_one_clear_line(tmp_path, kind):
    path = tmp_path / "bad.pt"
    good = _good_checkpoint(tmp_path / "good.pt")
    state = torch.load(tmp_path / "good.pt", weights_only=True)
    if kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "random":
        path.write_bytes(random.Random(0).randbytes(5000))
    elif kind == "text":  # a file of items given where the checkpoint goes: torch's unpickler raised IndexError
        path.write_text("abc\n\nzzz\n")
    elif kind == "pickle":  # plain pickle.dump: torch warned about its protocol on stderr before refusing it
        path.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "not-a-dict":
        torch.save([1, 2, 3], path)
    elif kind == "format":
        state["format_version"] = 99
        torch.save(state, path)
    elif kind == "vocab":
        state["vocab"] = list("abc")  # the embedding has 5 rows
        torch.save(state, path)
    elif kind == "shape":
        state["config"]["model"]["n_embd"] = 32
        torch.save(state, path)
    for command in ("eval", "sample", "info"):
        with warnings.catch_warnings(record=True) as caught:  # a warning would print lines beside the error's
            warnings.simplefilter("always")
            result = run_cli(command, path)
        assert_one_line_error(result, 2, str(path))
        assert "could run code" not in result.stderr  # damaged is not dangerous: say which
        assert not caught, [str(w.message) for w in caught]


def test_torch_older_than_2_6_is_refused():
    with pytest.raises(UsageError, match="torch >= 2.6"):
        require_torch("2.5.1+cpu")
    require_torch("2.6.0")
    require_torch("2.13.0+cu128")


# 7. Hostile data and config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case,needle",
    [
        ("missing", "not found"),
        ("empty", "empty"),
        ("short", "too short"),
        ("latin1", "byte offset"),
        ("directory", "holds no non-empty files"),
    ],
)
def test_bad_data_files_are_refused_before_any_work(tmp_path, case, needle):
    data = tmp_path / "data.txt"
    if case == "empty":
        data.write_bytes(b"")
    elif case == "short":
        data.write_text("hello there\n")
    elif case == "latin1":
        data.write_bytes(b"plain text then caf\xe9\n" * 100)
    elif case == "directory":
        data.mkdir()
    result = run_cli(*train_cli(data, tmp_path / "run", config="tiny"))
    assert_one_line_error(result, 2, needle)
    assert not (tmp_path / "run" / "last.pt").exists()


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["train.lr=0"], "train.lr"),
        (["model.block_size=0"], "model.block_size"),
        (["model.n_embd=100", "model.n_head=3"], "divisible"),
        (["model.dropout=1"], "model.dropout"),
        (["data.val_fraction=1.5"], "data.val_fraction"),
        (["model.n_layr=3"], "did you mean 'model.n_layer'"),
        (["train.batch_size=big"], "train.batch_size"),
    ],
)
def test_bad_config_values_are_refused_before_any_work(tmp_path, corpus, sets, needle):
    result = run_cli(*train_cli(corpus, tmp_path / "run", config="tiny", sets=sets))
    assert_one_line_error(result, 2, needle)
    assert not (tmp_path / "run").exists()


def test_a_broken_yaml_file_is_one_line(tmp_path, corpus):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: 2\n   n_head: 4\n")
    assert_one_line_error(run_cli(*train_cli(corpus, config=bad)), 2, "not valid YAML", "line")


def test_an_out_dir_that_is_a_file_or_unwritable_is_refused(tmp_path, corpus):
    afile = tmp_path / "afile"
    afile.write_text("my notes")
    assert_one_line_error(run_cli(*train_cli(corpus, afile, config="tiny")), 2, "is a file")
    inside = afile / "run"  # a folder below a file can never be created
    assert_one_line_error(run_cli(*train_cli(corpus, inside, config="tiny")), 2, "cannot write")
    assert afile.read_text() == "my notes"


# 8. Hostile sampling input: see tests/test_sample_cli.py; 9. downloads: tests/test_download.py;
# 11. run-folder discipline: tests/test_train.py::test_an_existing_run_is_not_overwritten_by_accident.


def test_unknown_checkpoint_key_layout_is_not_a_partial_load(tmp_path):
    _good_checkpoint(tmp_path / "m.pt")
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    state["model"].pop("head.weight", None)
    state["model"].pop("blocks.0.mlp.fc.weight")
    torch.save(state, tmp_path / "partial.pt")
    with pytest.raises(UsageError, match="does not match"):
        load_checkpoint(tmp_path / "partial.pt").build_model()


def test_written_files_take_the_umask_s_mode_and_keep_a_replaced_file_s(tmp_path):
    """Not mkstemp's 0600: a run folder or an export is read by others (a web server, a colleague)."""
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "new.json", lambda f: f.write(b"{}"))
        assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644
        (tmp_path / "shared.png").write_bytes(b"old")
        (tmp_path / "shared.png").chmod(0o664)
        atomic_write(tmp_path / "shared.png", lambda f: f.write(b"new"))
        assert stat.S_IMODE((tmp_path / "shared.png").stat().st_mode) == 0o664
        os.umask(0o077)
        atomic_write(tmp_path / "private.pt", lambda f: f.write(b"x"))
        assert stat.S_IMODE((tmp_path / "private.pt").stat().st_mode) == 0o600
    finally:
        os.umask(old)
