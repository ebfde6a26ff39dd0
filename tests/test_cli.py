"""The command line as a whole: help, --version, the console script, option and config errors, --debug, --json."""

import json
import sys

import pytest
from conftest import assert_one_line_error, run_cli, train_cli

from charlm import __version__


def test_help_lists_the_commands_and_exit_codes():
    result = run_cli("--help")
    assert result.returncode == 0
    for word in ("download", "train", "eval", "Exit codes"):
        assert word in result.stdout


def test_download_help_reads_well():
    out = run_cli("download", "--help").stdout
    for flag in ("--url", "--dest", "--sha256", "--no-verify", "--force", "CHARLM_DATA_URL"):
        assert flag in out


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"charlm {__version__}"


@pytest.mark.process
def test_python_dash_m_and_the_console_script_agree():
    """The console script itself is the subject: it must be installed (pip install -e .) beside this Python."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "charlm"
    exe = str(beside) if beside.is_file() else shutil.which("charlm")
    assert exe, 'the charlm console script is not installed beside this Python: pip install -e ".[test]"'
    result = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"charlm {__version__}"


def test_unknown_option_is_one_line_exit_2():
    assert_one_line_error(run_cli("download", "--bogus"), 2, "--bogus")
    assert_one_line_error(run_cli("train", "--max-steps", "many"), 2, "--max-steps")


def test_serve_without_its_extra_names_the_package_it_cannot_import(monkeypatch, tmp_path):
    """A missing uvicorn, as Python reports one (None in sys.modules makes `import uvicorn` fail), before any model is
    read: the line names the module and the install command."""
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    result = run_cli("serve", tmp_path / "model.pt", "--port", "0")
    assert_one_line_error(result, 2, "cannot import uvicorn", 'pip install -e ".[serve]"')


def test_bad_set_names_the_key(tmp_path, corpus):
    result = run_cli("train", "--data", corpus, "--out-dir", tmp_path / "r", "--set", "model.n_embd=-4")
    assert_one_line_error(result, 2, "model.n_embd")
    assert not (tmp_path / "r").exists()


def test_a_value_is_printed_as_given_never_as_an_emoji(tmp_path, corpus):
    """rich reads ':x:' as an emoji code: a message quoting the user's value must show the value."""
    result = run_cli("train", "--data", corpus, "--out-dir", tmp_path / "r", "--set", "train.lr=:x:")
    assert_one_line_error(result, 2, "got ':x:' (--set train.lr=:x:)")


def test_several_config_errors_are_listed_together(tmp_path, corpus):
    result = run_cli("train", "--data", corpus, "--set", "model.n_layers=2", "--set", "train.lr=0")
    assert result.returncode == 2
    assert "model.n_layers" in result.stderr and "did you mean 'model.n_layer'" in result.stderr
    assert "train.lr" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.process
def test_debug_shows_the_traceback(tmp_path):
    # The interpreter prints it. A command that fails before it would import torch (a config file that is not
    # there): the process is the subject, not what it would have run.
    result = run_cli("--debug", "config", "--config", tmp_path / "missing.yaml", process=True)
    assert result.returncode != 0 and "Traceback" in result.stderr and "config file not found" in result.stderr


def test_json_is_one_object_on_one_line(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", steps=20, json=True))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["steps"] == 20 and "\x1b[" not in result.stderr


def test_a_runs_relative_data_path_missing_from_another_folder_says_where_it_looked(tmp_path, corpus, monkeypatch):
    """A run keeps its data path as it was given; read from another folder, the line names the folder it looked in
    and how to point at the file, and a path that is no built-in corpus is not told to `charlm download`."""
    (tmp_path / "project" / "texts").mkdir(parents=True)
    (tmp_path / "project" / "texts" / "mine.txt").write_bytes(corpus.read_bytes())
    monkeypatch.chdir(tmp_path / "project")
    run_cli(*train_cli("texts/mine.txt", "run", steps=2, quiet=True), check=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    refused = run_cli("eval", tmp_path / "project" / "run")
    where = tmp_path / "elsewhere"
    assert_one_line_error(refused, 2, f"data path not found: texts/mine.txt in {where}", "relative path", "--data")
    assert "charlm download" not in refused.stderr
    given = tmp_path / "project" / "texts" / "mine.txt"  # the same file by its full path: its validation split
    scored = run_cli("eval", tmp_path / "project" / "run", "--data", given, "--split", "val", check=True)
    assert scored.stdout.startswith(f"val split of {given}: loss ")
    builtin = run_cli("eval", tmp_path / "project" / "run", "--data", "data/text8")  # a built-in corpus's own place
    assert_one_line_error(builtin, 2, "data path not found: data/text8", "run `charlm download text8`")


@pytest.mark.parametrize(
    "args,flag",
    [
        (["train", "-c", "tiny", "--set", "train.max_steps=1", "--out-dir", ""], "--out-dir"),
        (["sweep", "spec.yaml", "--out-dir="], "--out-dir"),
        (["train", "-c", "", "--set", "train.max_steps=1"], "--config"),
        (["config", "--config", " "], "--config"),
    ],
)
def test_an_empty_folder_or_config_is_refused_not_taken_as_here_or_the_default(tmp_path, args, flag):
    """An empty value (most often an unset shell variable) would train into the current folder, or quietly run the
    default config: refused in one line, nothing written."""
    assert_one_line_error(run_cli(*args, cwd=tmp_path), 2, flag, "is empty")
    assert list(tmp_path.iterdir()) == []
