"""Export folders as `charlm sample`, `eval` and charlm.load find them: one with a file deleted is named as the export
it is, with the file it lacks; `charlm export` given only the model says that DIR is missing; and the commands that
messages and model cards print run as printed where a path holds a space."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

import charlm


@pytest.fixture(scope="module")
def safetensors_export(tiny_checkpoint, tmp_path_factory) -> Path:
    pytest.importorskip("safetensors", reason="exports need the safetensors package (the test extra has it)")
    out = tmp_path_factory.mktemp("export") / "exp"
    run_cli("export", tiny_checkpoint, out, check=True)
    return out


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory, corpus) -> Path:
    """A small decoder's ONNX export, the one tests/test_onnx.py checks (this module runs in its worker: SAME_WORKER
    in tests/conftest.py), so that the worker pays for one export of it; the tests damage copies of it."""
    for module in ("onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason="ONNX exports need the onnx extra: pip install -e '.[test]'")
    from test_onnx import exported_decoder

    return exported_decoder("learned", tmp_path_factory, corpus)[1]


def _without(export: Path, name: str, tmp_path: Path) -> Path:
    damaged = tmp_path / "damaged"
    shutil.copytree(export, damaged)
    (damaged / name).unlink()
    return damaged


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "vocab.json"])
def test_an_export_missing_a_file_names_it(safetensors_export, corpus, tmp_path, name):
    damaged = _without(safetensors_export, name, tmp_path)
    for args in (("sample", damaged), ("eval", damaged, "--data", corpus)):
        result = run_cli(*args)
        assert_one_line_error(result, 2, f"export {damaged} lacks {name}", "export it again", "charlm export CKPT DIR")
    with pytest.raises(charlm.UsageError, match=f"lacks {name}"):
        charlm.load(damaged)


@pytest.mark.parametrize("name", ["model.onnx", "config.json", "vocab.json"])
def test_an_onnx_export_missing_a_file_names_it(onnx_export, corpus, tmp_path, name):
    damaged = _without(onnx_export, name, tmp_path)
    for args in (("sample", damaged), ("eval", damaged, "--data", corpus)):
        result = run_cli(*args)
        assert_one_line_error(result, 2, f"lacks {name}", "ONNX", "export it again", "--format onnx")
        assert "without best.pt" not in result.stderr


def test_onnx_graphs_beside_a_config_of_another_kind_are_named(onnx_export, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(onnx_export, damaged)
    (damaged / "config.json").write_text('{"model_type": "gpt2"}')  # another tool's config, or a damaged one
    result = run_cli("sample", damaged)
    assert_one_line_error(result, 2, "holds ONNX graphs", "not a charlm ONNX export's", "--format onnx")


def test_export_given_only_the_model_says_dir_is_missing(tiny_checkpoint, tmp_path):
    shutil.copytree(tiny_checkpoint.parent, tmp_path / "runs" / "r")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for given, kind in (("runs/r", "a run folder"), ("runs/r/best.pt", "a checkpoint file")):
        result = run_cli("export", given, cwd=tmp_path)
        assert_one_line_error(result, 2, f"DIR is missing: {given} is {kind}", f"(charlm export {given} DIR)")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
    exported = run_cli("export", "out", cwd=tmp_path)  # one path that is not a model: DIR, for the newest run
    assert exported.returncode == 0 and "runs/r/best.pt" in exported.stderr, exported.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_commands_that_name_a_path_with_a_space_quote_it_so_they_run_as_printed(tiny_checkpoint, tmp_path):
    spaced = tmp_path / "my runs" / "r"
    shutil.copytree(tiny_checkpoint.parent, spaced)
    result = run_cli("export", spaced)
    assert_one_line_error(result, 2, f"(charlm export {shlex.quote(str(spaced))} DIR)")
    result = run_cli("fill", spaced, "--prompt", "RO_EO")  # a decoder: the message says what runs it instead
    assert_one_line_error(result, 2, f"charlm sample {shlex.quote(str(spaced / 'best.pt'))} --prompt TEXT")
    folder = tmp_path / "my export"
    run_cli("export", spaced, folder, check=True)
    card = (folder / "README.md").read_text(encoding="utf-8")
    command = next(line for line in card.splitlines() if line.startswith("charlm sample "))
    printed = run_cli(*shlex.split(command)[1:], "--max-new-tokens", "20", check=True)  # the card's command, as typed
    assert printed.stdout.startswith("JULIET:")
    assert f'charlm.load("{folder}")' in card
