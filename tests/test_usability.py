"""What people at a terminal and shell scripts see: colour only for people, plots, the resolved config."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
from conftest import REPO, assert_one_line_error, run_cli, train_cli


def run_in_tty(*args: str, env: dict | None = None, timeout: float = 120) -> str:
    """Run the CLI with stdout and stderr on a pseudo-terminal of 100 x 40, as a person would see it."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    inherited = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    full_env = {**inherited, "PYTHONPATH": str(REPO), "COLUMNS": "100", **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "charlm", *map(str, args)],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=full_env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=timeout)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_piped_output_has_no_ansi_codes_or_progress_bar(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", steps=20), check=True)
    for text in (result.stdout, result.stderr):
        assert "\x1b[" not in text and "\r" not in text
    assert "done (max_steps)" in result.stdout


@pytest.mark.process
def test_a_terminal_gets_colour_and_a_step_count_and_no_color_turns_colour_off(tmp_path, corpus):
    coloured = run_in_tty(*train_cli(corpus, tmp_path / "a", steps=30))
    assert "\x1b[" in coloured and "done" in coloured
    assert re.search(r"\d+/30 \[", coloured), coloured  # a step-limited run counts steps
    # every command's console comes from charlm.progress.console, which reads NO_COLOR: training shows it for all
    plain = run_in_tty(*train_cli(corpus, tmp_path / "b", steps=20), env={"NO_COLOR": "1"})
    assert "\x1b[" not in plain and "done" in plain and "nats/char" in plain


@pytest.mark.process
def test_a_time_budgeted_run_shows_seconds_and_the_time_left_on_a_terminal(tmp_path, corpus):
    # a budget of one second: every second of it is spent training, and one shows the bar's seconds as more would
    screen = run_in_tty(*train_cli(corpus, tmp_path / "r", steps=0, max_seconds=1))
    bars = [part for part in re.split(r"[\r\n]", screen) if "/1 s [" in part]
    assert bars, screen
    assert re.search(r"\d+%\|.*\| \d/1 s \[00:0\d<00:0\d, step [\d,]+ loss \d\.\d{4}", bars[-1]), bars[-1]


def test_quiet_prints_only_the_summary(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", steps=20, quiet=True), check=True)
    assert result.stderr == "" and result.stdout.startswith("done")


def test_plot_writes_a_real_png(tmp_path, corpus):
    pytest.importorskip("matplotlib")
    for name in ("a", "b"):
        run_cli(*train_cli(corpus, tmp_path / name, steps=30, seed=ord(name)), check=True)
    out = tmp_path / "loss.png"
    run_cli("plot", tmp_path / "a", tmp_path / "b", "-o", out, check=True)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    run_cli("plot", tmp_path / "a", "-o", tmp_path / "loss.pdf", check=True)  # the name's ending picks the format
    assert (tmp_path / "loss.pdf").read_bytes()[:5] == b"%PDF-"
    refused = run_cli("plot", tmp_path / "a", "-o", tmp_path / "loss.txt")
    assert_one_line_error(refused, 2, "loss.txt", ".png, .pdf, .svg")
    assert not (tmp_path / "loss.txt").exists()


def test_plot_of_a_folder_without_metrics_is_one_line(tmp_path):
    assert_one_line_error(run_cli("plot", tmp_path), 2, "metrics.jsonl")
    assert_one_line_error(run_cli("plot", tmp_path / "nowhere"), 2, "nowhere not found", "run folder")
    (tmp_path / "notes.txt").write_text("mine")
    assert_one_line_error(run_cli("plot", tmp_path / "notes.txt"), 2, "notes.txt is a file, not a run folder")


def test_plot_of_damaged_metrics_or_into_a_folder_is_one_line(tmp_path):
    pytest.importorskip("matplotlib")
    good = {"step": 10, "elapsed_s": 1.0, "train_loss": 2.0, "val_loss": 2.1, "lr": 0.01}
    damaged = [("{not json", "line 2 is not JSON"), ('{"step": 1, "val_loss": "x"}', "line 2 has no number for")]
    damaged += [("[1, 2]", "line 2 has no number for step"), (json.dumps({**good, "lr": None}), "no number for lr")]
    for line, needle in damaged:
        (tmp_path / "metrics.jsonl").write_text(json.dumps(good) + "\n" + line + "\n")
        assert_one_line_error(run_cli("plot", tmp_path, "-o", tmp_path / "p.png"), 2, needle, "damaged")
    (tmp_path / "metrics.jsonl").write_text(json.dumps(good) + "\n")
    assert_one_line_error(run_cli("plot", tmp_path, "-o", tmp_path), 2, "is a folder")
    under_a_file = tmp_path / "metrics.jsonl" / "p.png"  # mkdir says only 'File exists': the file is named
    assert_one_line_error(run_cli("plot", tmp_path, "-o", under_a_file), 2, "metrics.jsonl is a file, not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_config_show_prints_the_resolved_yaml(tmp_path):
    import yaml

    result = run_cli("config", "--show", "--config", "tiny", "--set", "train.lr=0.01", check=True)
    shown = yaml.safe_load(result.stdout)
    assert shown["train"]["lr"] == 0.01 and shown["model"]["n_layer"] == 2
    assert set(shown) == {"data", "model", "train", "sample"}
    plain = yaml.safe_load(run_cli("config", check=True).stdout)  # no option needed: cpu, the default config
    assert plain == yaml.safe_load(run_cli("config", "--show", "--config", "cpu", check=True).stdout)


def test_config_keys_lists_every_key_with_type_default_and_meaning():
    from charlm.config.reference import key_reference

    out = run_cli("config", "--keys", check=True).stdout
    for k in key_reference():
        assert f"{k.key} = {k.default}  ({k.type})" in out and k.help in out
    assert "train.lr = 0.001  (a number)" in out


def test_json_summary_of_eval_and_info_are_single_lines(tmp_path, corpus):
    run_cli(*train_cli(corpus, tmp_path / "r", steps=10), check=True)
    for args in (["eval", tmp_path / "r" / "best.pt", "--json"], ["info", tmp_path / "r" / "best.pt", "--json"]):
        out = run_cli(*args, check=True).stdout
        assert len(out.splitlines()) == 1 and isinstance(json.loads(out), dict)
