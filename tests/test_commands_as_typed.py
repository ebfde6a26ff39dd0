"""The commands people type, exactly as written: default checkpoint, run folders, stdin prompts, re-runnable resume,
choices in help, what eval scored, and commands that answer without importing torch."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import REPO, assert_one_line_error, run_cli, train_cli


def _train(cwd, out_dir, corpus, steps=10, **options):
    return run_cli(*train_cli(corpus, out_dir, steps=steps, json=True, **options), cwd=cwd, check=True)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, corpus):
    """A working folder with runs/old and runs/new, new written last."""
    work = tmp_path_factory.mktemp("work")
    _train(work, "runs/old", corpus, seed=1)
    _train(work, "runs/new", corpus, seed=2)
    now = time.time()  # modification times set, not waited for: some file systems keep whole seconds
    for path in (work / "runs" / "old").iterdir():
        os.utime(path, (now - 60, now - 60))
    return work


def test_sample_and_eval_without_a_checkpoint_use_the_newest_run_and_say_so(two_runs):
    sampled = run_cli(
        "sample", "--prompt", "JULIET:", "--max-new-tokens", "20", "--seed", "1", cwd=two_runs, check=True
    )
    assert sampled.stdout.startswith("JULIET:")
    assert sampled.stderr.strip() == f"using {os.path.join('runs', 'new', 'best.pt')} (newest run)"
    explicit = run_cli(
        "sample",
        "runs/new/best.pt",
        "--prompt",
        "JULIET:",
        "--max-new-tokens",
        "20",
        "--seed",
        "1",
        cwd=two_runs,
        check=True,
    )
    assert explicit.stdout == sampled.stdout and explicit.stderr == ""
    evaluated = run_cli("eval", "--json", cwd=two_runs, check=True)
    assert "runs/new/best.pt (newest run)" in evaluated.stderr and json.loads(evaluated.stdout)["loss"] > 0
    assert "runs/new/best.pt" in run_cli("info", cwd=two_runs, check=True).stderr


def test_a_sweeps_trial_is_never_the_default_checkpoint(two_runs, tmp_path):
    work = shutil.copytree(two_runs, tmp_path / "work")
    trial = work / "runs" / "shape" / "trial-000"  # where charlm sweep writes its trials, newer than every run
    shutil.copytree(work / "runs" / "old", trial)
    evaluated = run_cli("eval", "--json", cwd=work, check=True)
    assert evaluated.stderr.strip() == f"using {os.path.join('runs', 'new', 'best.pt')} (newest run)"
    shutil.rmtree(work / "runs" / "new")
    shutil.rmtree(work / "runs" / "old")  # only the trial is left: charlm says how to name it
    missing = run_cli("eval", cwd=work)
    assert_one_line_error(missing, 2, "no checkpoint given and none found under runs/*/")


def test_a_run_folder_stands_for_its_best_checkpoint(two_runs):
    folder = run_cli("eval", "runs/old", "--json", cwd=two_runs, check=True)
    file = run_cli("eval", "runs/old/best.pt", "--json", cwd=two_runs, check=True)
    assert json.loads(folder.stdout) == json.loads(file.stdout) and folder.stderr == ""
    info = run_cli("info", "runs/old", "--json", cwd=two_runs, check=True)
    assert json.loads(info.stdout)["total_params"] > 0


def test_no_run_and_no_checkpoint_is_one_line_saying_what_to_do(tmp_path):
    for command in ("sample", "eval"):
        assert_one_line_error(run_cli(command, cwd=tmp_path), 2, "no checkpoint", "charlm train")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli("sample", "empty", cwd=tmp_path), 2, "without best.pt")


def test_prompt_file_dash_reads_standard_input(tiny_checkpoint):
    result = run_cli(
        "sample", tiny_checkpoint, "--prompt-file", "-", "--max-new-tokens", "20", input="ROMEO:\n", check=True
    )
    assert result.stdout.startswith("ROMEO:\n") and len(result.stdout) >= len("ROMEO:\n") + 20


def test_a_missing_prompt_file_is_named_as_a_prompt_file(tiny_checkpoint, tmp_path):
    result = run_cli("sample", tiny_checkpoint, "--prompt-file", tmp_path / "opening.txt")
    assert_one_line_error(result, 2, "prompt file not found", "opening.txt", "- to read standard input")
    assert "data file" not in result.stderr and "charlm download" not in result.stderr


def test_the_same_command_with_resume_appended_continues_the_run(tmp_path, corpus):
    sets = ["model.dropout=0.1", "train.seed=3", "train.max_steps=10"]
    first = train_cli(corpus, tmp_path / "r", json=True, sets=sets)
    run_cli(*first, check=True)
    again = run_cli(*first, "--resume", "--set", "train.max_steps=20", check=True)
    assert json.loads(again.stdout)["steps"] == 20


def test_resume_says_once_that_the_data_file_changed_since_the_run_started(tmp_path, corpus):
    """Text of the same characters appended to the file: the resumed run trains on it as it is (a user may mean to),
    and says so, with both sizes, on the first resume after the change only."""
    data = tmp_path / "mine.txt"
    text = corpus.read_text(encoding="utf-8")
    data.write_text(text, encoding="utf-8")
    run_cli(*train_cli(data, tmp_path / "r", steps=2, quiet=True), check=True)
    data.write_text(text + text[:3000], encoding="utf-8")
    changed = run_cli(*train_cli(out=tmp_path / "r", resume=True, steps=4), check=True)
    size = len(text.encode())
    said = [line for line in changed.stderr.splitlines() if "has changed since this run last started" in line]
    assert len(said) == 1 and f"({size:,} bytes, now {size + 3000:,})" in said[0], changed.stderr
    again = run_cli(*train_cli(out=tmp_path / "r", resume=True, steps=6), check=True)
    assert "has changed" not in again.stderr


def test_resume_refuses_a_real_change_naming_saved_and_given_values_once(tmp_path, corpus):
    first = train_cli(corpus, tmp_path / "r", steps=10)
    run_cli(*first, check=True)
    refused = run_cli(*first, "--resume", "--set", "model.n_embd=48")
    assert_one_line_error(refused, 2, "model.n_embd", "32", "48", "resum")
    both = run_cli(*first, "--resume", "--set", "model.n_embd=48", "--set", "train.lr=0.5")
    assert both.returncode == 2 and "Traceback" not in both.stderr
    assert both.stderr.count("model.n_embd") == 1 and both.stderr.count("train.lr cannot") == 1


def test_resume_checks_the_given_keys_beside_the_run_s_own_not_the_defaults(tmp_path, corpus):
    """The run is 48 wide with 3 heads: its heads given again are no change (the defaults' 128 wide would refuse 3
    heads), and a change that leaves the run no limit is refused, the run left as it was."""
    run = tmp_path / "r"
    run_cli(*train_cli(corpus, run, steps=4, sets=["model.n_embd=48", "model.n_head=3"]), check=True)
    again = run_cli(*train_cli(out=run, resume=True, steps=6, json=True, sets=["model.n_head=3"]), check=True)
    assert json.loads(again.stdout)["steps"] == 6
    before = (run / "last.pt").read_bytes()
    limitless = run_cli(*train_cli(out=run, resume=True, sets=["train.max_steps=0", "train.max_seconds=0"]))
    assert_one_line_error(limitless, 2, "train.max_steps and train.max_seconds are both 0")
    assert (run / "last.pt").read_bytes() == before


def test_resume_compares_a_given_config_file_too(tmp_path, corpus):
    run_cli(*train_cli(corpus, tmp_path / "r", steps=5, config="tiny"), check=True)
    same = run_cli(*train_cli(corpus, tmp_path / "r", steps=10, config="tiny", resume=True, json=True), check=True)
    assert json.loads(same.stdout)["steps"] == 10
    other = run_cli(*train_cli(corpus, tmp_path / "r", config="cpu", resume=True))
    assert other.returncode == 2 and "model.n_embd" in other.stderr and "Traceback" not in other.stderr


@pytest.mark.parametrize(
    "args",
    [["--help"], ["config"], ["config", "--keys"], ["download", "--help"], ["train", "--help"], ["sample", "--help"]],
)
@pytest.mark.process
def test_fast_commands_do_not_import_torch(args):
    code = (
        "import sys\nfrom charlm.cli.app import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    assert not e.code, e.code\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_download_does_not_import_torch(corpus, tmp_path):
    code = (
        "import sys\nfrom charlm.cli.app import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    assert not e.code, e.code\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    args = ["download", "--url", corpus.as_uri(), "--dest", str(tmp_path / "t.txt"), "--no-verify"]
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr


def test_help_shows_the_choices_of_fixed_value_options():
    eval_help = run_cli("eval", "--help", env={"COLUMNS": "200"}, check=True).stdout
    assert "<val|test|train|all>" in eval_help and "<error|skip|replace>" in eval_help
    sample_help = run_cli("sample", "--help", env={"COLUMNS": "200"}, check=True).stdout
    assert "<error|skip|replace>" in sample_help and "auto, cpu, cuda, cuda:N or mps" in sample_help
    assert_one_line_error(run_cli("eval", "--split", "tset"), 2, "--split", "tset")


@pytest.mark.process
def test_device_completes_in_the_shell():
    env = {"_CHARLM_COMPLETE": "complete_bash", "COMP_WORDS": "charlm sample --device c", "COMP_CWORD": "3"}
    result = subprocess.run(
        ["charlm"] if shutil.which("charlm") else [sys.executable, "-m", "charlm"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
    )
    assert set(result.stdout.split()) >= {"cpu", "cuda"}, (result.stdout, result.stderr)


def test_eval_names_the_split_and_file_and_scores_all_of_another_file(tmp_path, corpus):
    _train(tmp_path, "run", corpus)
    own = run_cli("eval", "run", cwd=tmp_path, check=True).stdout
    assert own.startswith(f"val split of {corpus}: loss")
    other = tmp_path / "other.txt"
    other.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 10)
    whole = json.loads(run_cli("eval", "run", "--data", other, "--json", cwd=tmp_path, check=True).stdout)
    assert whole["split"] == "all" and whole["file"] == str(other)
    assert whole["chars"] == len(other.read_text()) - 1
    tail = json.loads(
        run_cli("eval", "run", "--data", other, "--split", "val", "--json", cwd=tmp_path, check=True).stdout
    )
    assert tail["split"] == "val" and tail["chars"] < whole["chars"]
    assert run_cli("eval", "run", "--data", other, cwd=tmp_path, check=True).stdout.startswith(f"all of {other}:")
