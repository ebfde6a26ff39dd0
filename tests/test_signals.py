"""A run stopped from outside, as a process: kill -9 at any moment, SIGINT and SIGTERM, a signal while compiling
(docs/reliability.md, guarantees 2 and 4)."""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, freeze, last_logged_step, run_cli, train_cli

from charlm.storage.checkpoint import load_checkpoint

pytestmark = pytest.mark.process


# Every wait below is for an event of the run (a line it prints, a file it writes); the seconds are only a guard
# against a hung process, never a measure of speed.
HANG_S = 300
EVALUATION = r"^\s*\d+\s+\d+\.\d{4}\s+\d+\.\d{4}\s"  # an evaluation line: step, train loss, validation loss, ...


class Training:
    """`charlm train` as a real process; a thread reads its stderr line by line as it comes (so that the pipe never
    fills), for a test to act on what the run has printed or written."""

    def __init__(self, *args: str, env: dict | None = None):
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "charlm", *args],
            env=full_env,
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []  # the stderr lines taken from the queue so far
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for_line(self, pattern: str, count: int = 1) -> str:
        """Until the count-th stderr line (from now) that matches `pattern`."""
        deadline = time.monotonic() + HANG_S
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError(f"no line {pattern!r} in {HANG_S} s:\n{''.join(self.seen)}") from None
            if line is None:
                raise AssertionError(f"the run exited {self.proc.wait()} before {pattern!r}:\n{''.join(self.seen)}")
            self.seen.append(line)
            if re.search(pattern, line):
                count -= 1
                if count == 0:
                    return line

    def wait_until(self, condition: Callable[[], object], what: str) -> None:
        """Until condition() is true (polled), the process still running."""
        deadline = time.monotonic() + HANG_S
        while not condition():
            assert self.proc.poll() is None, f"the run exited {self.proc.returncode} before {what}"
            assert time.monotonic() < deadline, f"{what}: not in {HANG_S} s"
            time.sleep(0.001)

    def wait_for_temp_checkpoints(self, run: Path, count: int) -> None:
        """Until `count` new checkpoint temp files (.last.pt.*.tmp, .best.pt.*.tmp) have been seen in `run`: a save
        is under way (or has just renamed its file into place). One left by an earlier kill does not count."""
        left_before = {p.name for p in run.glob(".*.pt.*.tmp")}
        names: set[str] = set()

        def seen_enough() -> bool:
            names.update(p.name for p in run.glob(".*.pt.*.tmp"))
            return len(names - left_before) >= count

        self.wait_until(seen_enough, f"{count} checkpoint temp files in {run}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.reader.join()

    def finish(self) -> str:
        """Wait for the exit; every stderr line."""
        self.proc.wait(timeout=HANG_S)
        self.reader.join()
        while (line := self.lines.get()) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


# 2. kill -9 at any moment ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_at_random_moments_never_leaves_a_broken_last_pt(tmp_path, corpus):
    """Each kill follows an event of the run, never a delay: the fresh run is killed after its k-th evaluation line,
    then three resumed runs, in an order drawn from a seeded generator, each at one of: "training" (after its k-th
    evaluation line: in the steps after a save), "saving" (as soon as its k-th checkpoint temp file is seen: while
    best.pt or last.pt is written, or just after its rename), "start-up" (its "resuming" line: while it builds the
    model, before its first step). Each k (1 to 3) comes from the same generator."""
    run = tmp_path / "run"
    rng = random.Random(0)
    kill_after: dict[str, Callable[[Training, int], object]] = {
        "training": lambda training, k: training.wait_for_line(EVALUATION, count=k),
        "saving": lambda training, k: training.wait_for_temp_checkpoints(run, count=k),
        "start-up": lambda training, k: training.wait_for_line(r"^resuming "),
    }
    points = ["training", *rng.sample(sorted(kill_after), len(kill_after))]  # the fresh run saves before its kill
    saved_steps = []
    for attempt, point in enumerate(points):
        fresh = train_cli(corpus, run, steps=100000, sets=["train.eval_interval=2"])
        training = Training(*(fresh if attempt == 0 else train_cli(out=run, resume=True)))
        kill_after[point](training, rng.randint(1, 3))
        training.kill()
        saved_steps.append(load_checkpoint(run / "last.pt").step)  # complete, or the load would fail
    assert saved_steps[0] > 0 and saved_steps == sorted(saved_steps), saved_steps  # no kill undid a finished save
    (run / ".last.pt.stray.tmp").write_bytes(b"half a checkpoint")
    (run / ".config.yaml.stray.tmp").write_bytes(b"half a config")  # a kill while config.yaml was written
    (run / "..write-test.stray.tmp").write_bytes(b"")  # a kill while the folder was checked writable
    step_before = load_checkpoint(run / "last.pt").step
    done = run_cli(*train_cli(out=run, resume=True, steps=step_before + 4, json=True), check=True)
    assert json.loads(done.stdout)["steps"] == step_before + 4
    assert _temp_files(run) == []


# 4. SIGINT / SIGTERM ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_training_saves_and_exits_with_its_code(tmp_path, corpus, signum, code):
    run = tmp_path / "run"
    training = Training(*train_cli(corpus, run, steps=100000, quiet=True, sets=["train.log_interval=1"]))
    training.wait_until((run / "metrics.jsonl").exists, "the first evaluation")
    # The signal arrives while the process is stopped after its last logged step N: whatever the machine's speed, the
    # run stops at the next step boundary, N (stopped between two steps) or N + 1 (stopped inside the next one).
    freeze(training.proc.pid)
    last_logged = last_logged_step(run)
    training.proc.send_signal(signum)
    os.kill(training.proc.pid, signal.SIGCONT)
    if signum == signal.SIGINT:  # a second Ctrl-C while saving changes nothing: sent once the save has begun
        training.wait_until(lambda: training.proc.poll() is not None or list(run.glob(".*.pt.*.tmp")), "a save")
        training.proc.send_signal(signum)
    err = training.finish()
    assert training.proc.returncode == code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--resume" in lines[0] and "Traceback" not in err
    saved = load_checkpoint(run / "last.pt")
    assert saved.step in (last_logged, last_logged + 1) and _temp_files(run) == []
    assert f"stopped at step {saved.step} " in lines[0]
    resumed = run_cli(*train_cli(out=run, resume=True, steps=saved.step + 2, json=True), check=True)
    assert json.loads(resumed.stdout)["steps"] == saved.step + 2


@pytest.mark.slow
def test_a_signal_during_compilation_exits_at_once_and_writes_nothing(tmp_path, corpus):
    run, cache = tmp_path / "run", tmp_path / "inductor"
    # an empty inductor cache, so that compilation really happens (and takes many seconds) in this run
    training = Training(
        *train_cli(corpus, run, steps=50, quiet=True, sets=["train.compile=true"]),
        env={"TORCHINDUCTOR_CACHE_DIR": str(cache)},
    )
    # Inside torch.compile's first step: the inductor cache gets its first files (long before compilation ends here).
    training.wait_until(lambda: cache.is_dir() and any(p.is_file() for p in cache.rglob("*")), "an inductor file")
    assert not (run / "last.pt").exists(), "training had started before compilation was seen: nothing to test"
    training.proc.send_signal(signal.SIGTERM)
    err = training.finish()
    assert training.proc.returncode == 143, err
    assert "nothing was written" in err and not run.exists()
    # At once: the process ended before the compilation of the training step did (its forward and backward graphs
    # enter inductor's AOTAutograd cache as it ends), rather than compiling on to the end.
    assert not list((cache / "aotautograd").rglob("*")), "compilation went on to its end after the signal"
