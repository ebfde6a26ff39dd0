"""A run stopped from outside, as a process: kill -9 at any moment, SIGINT and SIGTERM, a signal while compiling
(docs/reliability.md, guarantees 2 and 4)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SMALL, run_cli

from charlm.storage.checkpoint import load_checkpoint

pytestmark = pytest.mark.process


def _popen(*args, cwd=None, env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "charlm", *map(str, args)],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def _train(corpus: Path, run: Path, *extra: str) -> list:
    """A small `charlm train` command line into `run`."""
    return ["train", *SMALL, "--data", corpus, "--out-dir", run, *extra]


def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _wait_for_save_or_exit(run: Path, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Until a checkpoint's temp file appears in `run` (the save after a signal has begun) or the process ends."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not list(run.glob(".*.pt.*.tmp")):
        assert time.monotonic() < deadline, "the process neither saved nor exited"
        time.sleep(0.005)


def _wait_for_any_file(folder: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"nothing appeared under {folder}"
        time.sleep(0.02)


# 2. kill -9 at any moment ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_at_random_moments_never_leaves_a_broken_last_pt(tmp_path, corpus):
    run = tmp_path / "run"
    rng = random.Random(0)
    args = _train(corpus, run, "--set", "train.eval_interval=2", "--max-steps", "100000", "--quiet")
    for attempt in range(4):  # a fresh run, then resumed ones, each killed at a random moment
        proc = _popen(*(args if attempt == 0 else ["train", "--resume", "--out-dir", run, "--quiet"]))
        if attempt == 0:
            _wait_for(run / "last.pt", proc)
        time.sleep(rng.uniform(0.3, 3.0))
        proc.kill()
        proc.wait()
        if (run / "last.pt").exists():
            assert load_checkpoint(run / "last.pt").step > 0  # complete, or the load would fail
    (run / ".last.pt.stray.tmp").write_bytes(b"half a checkpoint")
    (run / ".config.yaml.stray.tmp").write_bytes(b"half a config")  # a kill while config.yaml was written
    (run / "..write-test.stray.tmp").write_bytes(b"")  # a kill while the folder was checked writable
    step_before = load_checkpoint(run / "last.pt").step
    done = run_cli("train", "--resume", "--out-dir", run, "--max-steps", step_before + 4, "--json", check=True)
    assert json.loads(done.stdout)["steps"] == step_before + 4
    assert _temp_files(run) == []


# 4. SIGINT / SIGTERM ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_training_saves_and_exits_with_its_code(tmp_path, corpus, signum, code):
    run = tmp_path / "run"
    proc = _popen(*_train(corpus, run, "--max-steps", "100000", "--quiet"))
    _wait_for(run / "metrics.jsonl", proc)
    proc.send_signal(signum)
    if signum == signal.SIGINT:  # a second Ctrl-C while saving changes nothing: sent once the save has begun
        _wait_for_save_or_exit(run, proc)
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--resume" in lines[0] and "Traceback" not in err
    saved = load_checkpoint(run / "last.pt")
    assert saved.step > 0 and _temp_files(run) == []
    resumed = run_cli("train", "--resume", "--out-dir", run, "--max-steps", saved.step + 2, "--json", check=True)
    assert json.loads(resumed.stdout)["steps"] == saved.step + 2


@pytest.mark.slow
def test_a_signal_during_compilation_exits_at_once_and_writes_nothing(tmp_path, corpus):
    run = tmp_path / "run"
    # an empty inductor cache, so that compilation really happens (and takes many seconds) in this run
    proc = _popen(
        *_train(corpus, run, "--set", "train.compile=true", "--max-steps", "50", "--quiet"),
        env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )
    # Inside torch.compile's first step: the inductor cache gets its first files (long before compilation ends here).
    _wait_for_any_file(tmp_path / "inductor", proc)
    assert not (run / "last.pt").exists(), "training had started before compilation was seen: nothing to test"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert time.monotonic() - started < 10
    assert "nothing was written" in err and not run.exists()
