"""Shared test helpers: the shipped corpus excerpt, the CLI (in-process, or as a real subprocess), a loopback HTTP
server, a `charlm serve` process that the server tests share."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.util
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CorpusServer as CorpusServer  # re-exported: the tests import them from here
from helpers import freeze as freeze
from helpers import last_logged_step as last_logged_step
from helpers import step_losses as step_losses
from helpers import with_token_shift_weights as with_token_shift_weights

# While the test modules are collected (each worker imports torch and charlm), the garbage collector runs less
# often: imports build objects that live on, and at the default threshold it walks them over and over (over a second
# of each worker's start). pytest_collection_finish puts the default back where tests run (pytest-xdist's controller,
# which collects nothing and runs no test, keeps this one).
COLLECTING_THRESHOLD, DEFAULT_THRESHOLD = (20_000, 10, 10), gc.get_threshold()
gc.set_threshold(*COLLECTING_THRESHOLD)

REPO = Path(__file__).resolve().parents[1]
# The suite is the CPU's, as CI runs it: a GPU is hidden from it and from the processes it starts (before torch looks),
# so that its exact comparisons hold on a machine with one; tests/test_gpu.py shows it again to the charlm it runs.
os.environ.setdefault("CHARLM_TESTS_HID_CUDA", os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# --budget's rule at the reference machine's speed, never this machine's measured one: the same picks on any CPU and
# no probe's seconds in each test (tests/test_budget.py measures and gives speeds of its own).
os.environ["CHARLM_SPEED"] = "26000"
# Shipped with the tests (tests/data/README.md): every test can run in a bare clone with no network.
EXCERPT = REPO / "tests" / "data" / "tinyshakespeare-excerpt.txt"
EXCERPT_SHA256 = "f5ada1ed6c6cb67cbf283903727d5a33afdcee42c8a38202db8b06f55cc8b2f6"
EXCERPT_BYTES = 120_117
# The full corpus, for the few tests about it: $CHARLM_TEST_CORPUS, else what `charlm download` wrote.
FULL_CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
FULL_CORPUS_BYTES = 1_115_394
# A model small enough that a CLI training run takes a few seconds.
SMALL = [
    "--config",
    "tiny",
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_embd=32",
    "--set",
    "model.block_size=16",
    "--set",
    "train.eval_interval=10",
    "--set",
    "train.eval_windows=16",
]


def train_cli(
    data: Path | str | None = None,
    out: Path | str | None = None,
    *extra: object,
    steps: int | None = None,
    config: str | Path | list | tuple | None = None,
    sets: dict[str, object] | list[str] | None = None,
    **flags: object,
) -> list[str]:
    """The argument list of a `charlm train` command: train CONFIG --data DATA --out-dir OUT --set KEY=VALUE...
    --max-steps STEPS --FLAG [VALUE]... EXTRA...

    config: the SMALL model unless given (nothing with resume=True: a resumed run keeps its own); a config name or
    file passes `--config` it alone, a list passes its arguments as they are ([] passes none). data and out: left out
    when None. sets: {"train.lr": 0.01} or ["train.lr=0.01"], each a `--set`. flags: each keyword an option, its
    underscores dashes: quiet=True -> --quiet, seed=3 -> --seed 3, init_from=PATH -> --init-from PATH (False or None:
    left out). extra: appended as given.

        train_cli(corpus, run, steps=20, quiet=True, sets={"train.eval_interval": 2})
        train_cli(out=run, resume=True, steps=40, json=True)
    """
    if config is None:
        config = [] if flags.get("resume") else SMALL
    elif isinstance(config, (str, Path)):
        config = ["--config", config]
    args: list[object] = ["train", *config]
    if data is not None:
        args += ["--data", data]
    if out is not None:
        args += ["--out-dir", out]
    if isinstance(sets, dict):
        sets = [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in sets.items()]
    for item in sets or []:
        args += ["--set", item]
    if steps is not None:
        args += ["--max-steps", steps]
    for name, value in flags.items():
        if value is None or value is False:
            continue
        args.append("--" + name.replace("_", "-"))
        if value is not True:
            args.append(value)
    return [str(a) for a in [*args, *extra]]


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The tiny-shakespeare excerpt shipped in tests/data (61 distinct characters)."""
    assert sha256(EXCERPT) == EXCERPT_SHA256, f"{EXCERPT} was modified"
    return EXCERPT


@pytest.fixture(scope="session")
def full_corpus() -> Path:
    """The whole of tiny-shakespeare, or a skip that says where the test looked."""
    candidates = [Path(p) for p in [os.environ.get("CHARLM_TEST_CORPUS")] if p] + [
        REPO / "data" / "tinyshakespeare.txt"
    ]
    for path in candidates:
        if path.is_file() and path.stat().st_size == FULL_CORPUS_BYTES and sha256(path) == FULL_CORPUS_SHA256:
            return path
    pytest.skip("needs the full tiny-shakespeare: set CHARLM_TEST_CORPUS=/path/to/input.txt or run `charlm download`")


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 300,
    check: bool = False,
    input: str | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess:
    """`charlm ARGS` with no TTY (as in CI); stdin is `input`, else empty.

    In-process by default: the console script's own entry point (charlm.cli.app.main) runs in this interpreter with
    stdout, stderr and stdin captured, the environment and working folder patched, and SIGINT/SIGTERM handlers put
    back afterwards; it prints, exits and fails exactly as the command does, without paying for a new Python and
    torch each time. `process=True` runs `python -m charlm` in a real subprocess, for tests whose subject is the
    process itself (what it imports, its signals, its exit under a limit).
    """
    result = (_run_process if process else _run_in_process)([str(a) for a in args], cwd, env, timeout, input)
    if check and result.returncode != 0:
        raise AssertionError(f"charlm {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}")
    return result


def _run_process(args, cwd, env, timeout, input) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in ("CHARLM_DATA_URL", "NO_COLOR")}
    full_env = {**inherited, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "charlm", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **({"input": input} if input is not None else {"stdin": subprocess.DEVNULL}),
    )


def _run_in_process(args, cwd, env, timeout, input) -> subprocess.CompletedProcess:
    from charlm.cli.app import main

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stdout, stderr = io.StringIO(), io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
    saved_stdin = sys.stdin
    try:
        for name in ("CHARLM_DATA_URL", "NO_COLOR"):
            os.environ.pop(name, None)
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = stdin
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(args)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return subprocess.CompletedProcess(["charlm", *args], code, stdout.getvalue(), stderr.getvalue())


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """A user mistake: the expected exit code, one line on stderr naming the problem, no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def server(corpus: Path):
    """Serves the shipped excerpt: pass --sha256 EXCERPT_SHA256 where a download is verified."""
    s = CorpusServer(corpus.read_bytes())
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@contextlib.contextmanager
def callers_signal_handlers():
    """SIGINT and SIGTERM handlers of the caller's own (as a notebook's), put back afterwards; yields the handler, so
    that a test can check that charlm left it in place."""

    def mine(signum, frame) -> None:
        pass

    before = {signum: signal.signal(signum, mine) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield mine
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def handlers_are(handler) -> bool:
    return signal.getsignal(signal.SIGINT) is handler and signal.getsignal(signal.SIGTERM) is handler


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, corpus) -> Path:
    """best.pt of a small model trained once per test session through the real CLI."""
    run_dir = tmp_path_factory.mktemp("tiny-run")
    run_cli(*train_cli(corpus, run_dir, steps=60), check=True)
    return run_dir / "best.pt"


@pytest.fixture(scope="session")
def tiny_server(tiny_checkpoint):
    """`charlm serve` of tiny_checkpoint with the limits tests/test_serve.py tests, started once per worker:
    tests/test_serve.py, tests/test_same_text.py and tests/test_playground.py (one worker: SAME_WORKER) talk to the
    same process, which pays for its interpreter, torch and the model once."""
    from serve_helpers import ServerProcess

    limits = ["--max-tokens", "500", "--max-prompt", "100", "--max-n", "8", "--max-body", "20000"]
    process = ServerProcess(tiny_checkpoint, *limits)
    yield process
    process.stop()


@pytest.fixture
def mirror():
    """Start real loopback servers of given bytes (CorpusServer); all shut down after the test."""
    servers = []

    def serve(body: bytes) -> CorpusServer:
        s = CorpusServer(body)
        s.thread.start()
        servers.append(s)
        return s

    yield serve
    for s in servers:
        s.httpd.shutdown()
        s.httpd.server_close()


def assert_resume_is_exact(common: list, folder: Path, steps: int = 12) -> None:
    """`charlm train COMMON` straight to `steps`, and to steps/2 then --resume: the same losses and weights."""
    import torch

    from charlm.storage.checkpoint import load_checkpoint

    run_cli(*common, "--out-dir", folder / "straight", "--max-steps", steps, "--quiet", check=True)
    run_cli(*common, "--out-dir", folder / "split", "--max-steps", steps // 2, "--quiet", check=True)
    run_cli(*train_cli(out=folder / "split", resume=True, steps=steps, quiet=True), check=True)
    assert step_losses(folder / "straight") == step_losses(folder / "split")
    a = load_checkpoint(folder / "straight" / "last.pt").state["model"]
    b = load_checkpoint(folder / "split" / "last.pt").state["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# The modules with the most test time, longest first (python -m pytest --durations=0 on a 2-core CPU): pytest-xdist
# hands each worker whole modules in collection order, and a long one handed out last keeps one worker busy while
# the other has nothing left. The rest follow in file order. Modules of SAME_WORKER (below) go out as one unit, at the
# place of the first of them.
LONGEST_FIRST = [
    "test_onnx.py",
    "test_ddp.py",
    "test_encdec.py",
    "test_signals.py",
    "test_budget.py",
    "test_web_export.py",
    "test_usability.py",
    "test_python_api.py",
    "test_compiled_decode.py",
    "test_sweep.py",
    "test_transduction_protocol.py",
    "test_ensemble.py",
    "test_serve.py",
    "test_repl.py",
    "test_corpora.py",
    "test_train.py",
    "test_playground.py",
    "test_encoder.py",
]


# Modules that pay the same one-time cost in a worker run in one worker: torch.onnx's exporter, and torch.compile's
# first compilation in a process, take seconds to warm up; so do modules that share what a fixture made.
SAME_WORKER = {
    "tests/test_web_export.py": "tests/test_onnx.py",
    "tests/test_export_folders.py": "tests/test_onnx.py",  # its ONNX export is one of test_onnx.py's (shared)
    "tests/test_features.py": "tests/test_onnx.py",  # it exports a features model to ONNX
    "tests/test_same_text.py": "tests/test_serve.py",  # the same server (tiny_server)
    "tests/test_playground.py": "tests/test_serve.py",  # the same server (tiny_server)
    "tests/test_python_api.py": "tests/test_compiled_decode.py",  # its documented examples compile a decoder
    "tests/test_train.py": "tests/test_compiled_decode.py",  # train.compile=true
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's --dist loadscope (whole modules to a worker), with the modules of SAME_WORKER as one unit."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedWarmUps(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SAME_WORKER.get(scope, scope)

    return SharedWarmUps(config, log)


def skip_without(module: str, reason: str) -> pytest.MarkDecorator:
    """Skip a test module where `module` is not installed, found without importing it: collecting every module in
    every worker then costs no one the import of a package only some tests use."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=reason)


def pytest_collection_modifyitems(items: list) -> None:
    """Collect the longest modules first (see LONGEST_FIRST); a module's own tests keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort


def pytest_collection_finish(session) -> None:
    """Once every test module is imported, move what is alive then (torch, charlm, the test modules: millions of
    objects that live as long as the worker) out of the garbage collector's sight, and put its default threshold
    back: its full collections then walk only what the tests create (an ONNX export or a compilation in a worker takes
    about a sixth less CPU time). The tests' own objects are collected as before."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*DEFAULT_THRESHOLD)


def pytest_unconfigure(config) -> None:
    """The run is over: freeze what is still alive, so that the process exits without the garbage collector walking
    it all once more (half a second to a second of each worker's exit, which the run waits for)."""
    gc.freeze()


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker gets one core's worth of threads (its subprocesses too), so that two workers on
    a 2-core machine do not fight over the same cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
