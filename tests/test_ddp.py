"""Multi-process training with real torch.distributed: torchrun, gloo, two CPU processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, freeze, last_logged_step, run_cli, train_cli

from charlm.config.build import load_config
from charlm.data.corpus import Corpus, RandomWindows
from charlm.hardware.device import seed_everything
from charlm.models.decoder import Decoder
from charlm.models.linear import onednn_linears, use_onednn
from charlm.storage.checkpoint import load_checkpoint
from charlm.training.optim import make_optimizer
from charlm.training.setup import seed_for_rank

pytestmark = [pytest.mark.slow, pytest.mark.process]
TINY = [
    "--config",
    "tiny",
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_embd=32",
    "--set",
    "model.block_size=16",
    "--set",
    "train.eval_windows=16",
]
# A guard against a hung job only (never a measure of speed), under the process group's 10-minute timeout: a job
# still there after it was left to time out rather than brought down.
HANG_S = 300


def torchrun_args(*args: str, nproc: int = 2, program: tuple[str, ...] = ("-m", "charlm")) -> list[str]:
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return [*launch, *program, *map(str, args)]


def same_kernels(requested: str):
    """The linear layers' kernels a CPU run picks (train.cpu_linear), so that a reference step rounds as it does:
    Adam's first update is about ±lr wherever a gradient is near zero, whatever its rounding."""
    return onednn_linears(use_onednn(torch.device("cpu"), requested))


def launch_env(scratch: Path) -> dict[str, str]:
    """The environment of a torchrun launch: this checkout's charlm, one thread a rank, and the launcher's temporary
    folders (torchelastic_*) under scratch rather than the machine's /tmp, where they would outlive the test."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}


def torchrun(
    *args: str, nproc: int = 2, timeout: float = HANG_S, program: tuple[str, ...] = ("-m", "charlm")
) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="charlm-torchrun-") as scratch:
        return subprocess.run(
            torchrun_args(*args, nproc=nproc, program=program),
            env=launch_env(Path(scratch)),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


def test_two_ranks_train_and_hand_over_to_one_process_and_back(one_step_runs):
    run, first = one_step_runs["cli"]  # `charlm train` under two ranks (the launch's last run)
    assert first.returncode == 0, first.stderr
    assert "DDP: 2 processes (gloo)" in first.stderr
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["global_batch"] == 2 * 16
    assert sorted(p.name for p in run.iterdir()) == [
        "best.pt",
        "config.yaml",
        "last.pt",
        "metrics.jsonl",
        "summary.json",
    ]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [10, 20]
    assert first.stdout.count('"best_val_loss"') == 1  # rank 0 alone prints the summary
    saved = load_checkpoint(run / "last.pt")
    assert saved.step == 20 and saved.state["world_size"] == 2 and saved.state["global_batch"] == 32
    assert len(saved.state["ranks"]) == 2  # each rank's random streams (two ranks resuming: see one_step_runs)

    # a checkpoint written under DDP loads in single-process eval and sample, and resumes single-process
    assert json.loads(run_cli("eval", run / "last.pt", "--json", check=True).stdout)["chars"] > 0
    run_cli("sample", run / "last.pt", "--max-new-tokens", "20", check=True)
    single = run_cli(*train_cli(out=run, resume=True, steps=24, json=True), check=True)
    assert json.loads(single.stdout)["steps"] == 24 and "world size changed from 2 to 1" in single.stderr
    assert load_checkpoint(run / "last.pt").state["world_size"] == 1

    # and the single process's checkpoint resumes under torchrun, `python -m charlm` in each rank
    again = torchrun(*train_cli(out=run, resume=True, steps=28, json=True))
    assert again.returncode == 0, again.stderr
    assert "world size changed from 1 to 2" in again.stderr
    assert "DDP: 2 processes (gloo)" in again.stderr  # the group charlm makes for a CPU run
    assert again.stdout.count('"best_val_loss"') == 1 and json.loads(again.stdout.splitlines()[-1])["steps"] == 28
    saved = load_checkpoint(run / "last.pt")
    assert saved.step == 28 and saved.state["world_size"] == 2 and len(saved.state["ranks"]) == 2


def one_step_sets(*sets: str) -> list[str]:
    """A one-step run's settings: batch B = 4 per rank, no warm-up, a learning rate that moves every weight."""
    return ["train.batch_size=4", "train.warmup_steps=0", "train.lr=1e-2", *sets]


def pairs_data(folder: Path, given: bool, features: bool = False) -> tuple[Path, list[str]]:
    """Reversed words, and with `given` validation and test files of their own (every training line trained on);
    with `features`, a features column (two features a line, each one encoder input) and a synthetic line for each
    real one (data.hallucinate)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "pairs.tsv"
    words = ("abc", "bcad", "cabbd", "dd", "acdb") * 20
    tags = [f"{'V' if i % 2 else 'N'};{'PST' if i % 3 else 'PL'}" for i in range(len(words))]
    lines = (f"{w}\t{t}\t{w}s\n" if features else f"{w}\t{w[::-1]}\n" for w, t in zip(words, tags, strict=True))
    data.write_text("".join(lines))
    sets = ["model.arch=encoder-decoder", "data.format=pairs", "model.n_layer=1", "model.n_embd=32"]
    sets += ["model.block_size=16"]
    if features:
        sets += ["data.columns=source-features-target", "data.hallucinate=100"]
    if given:
        (folder / "val.tsv").write_text("bad\tdab\ncab\tbac\n")
        (folder / "test.tsv").write_text("dab\tbad\n")
        sets += [f"data.val_path={folder / 'val.tsv'}", f"data.test_path={folder / 'test.tsv'}"]
    return data, one_step_sets(*sets)


@pytest.fixture(scope="module")
def one_step_runs(tmp_path_factory, corpus) -> dict[str, tuple]:
    """One step of two ranks for each family (and both optimizers), a run resumed beside one that was not, and last
    `charlm train` itself (SMALL, 20 steps), all trained in one torchrun launch (tests/ddp_runs.py): name -> (data,
    the run's settings on top of the tiny config, the last.pt it saved), and "cli" -> (its run folder, the launch's
    result). The AdamW run keeps a weight average (train.ema_decay): every rank updates its own, and rank 0's is
    saved."""
    tmp = tmp_path_factory.mktemp("ddp-one-step")
    tiny = [s for s in TINY[2:] if s != "--set"]
    runs = {
        "adamw": (corpus, one_step_sets(*tiny, "train.optimizer=adamw", "train.ema_decay=0.9")),
        "muon": (corpus, one_step_sets(*tiny, "train.optimizer=muon")),
        "encoder": (corpus, one_step_sets(*tiny, "model.arch=encoder")),
        "split": pairs_data(tmp / "split", given=False),
        "given-files": pairs_data(tmp / "given-files", given=True),
        "features": pairs_data(tmp / "features", given=False, features=True),
    }
    spec = [
        {"config": "tiny", "sets": sets, "data": str(data), "out": str(tmp / name / "ddp"), "steps": 1}
        for name, (data, sets) in runs.items()
    ]
    # two ranks resuming their own checkpoint: six steps straight, and three then three more after a resume
    resumable = [*tiny, "model.dropout=0.1", "train.eval_interval=2", "train.log_interval=1"]
    for name, steps in (("straight", 6), ("resumed", 3)):
        spec.append({"config": "tiny", "sets": resumable, "data": str(corpus), "out": str(tmp / name), "steps": steps})
    spec.append({"config": None, "sets": [], "data": None, "out": str(tmp / "resumed"), "steps": 6, "resume": True})
    # SMALL, which evaluates every 10 steps (TINY: only as the run ends)
    spec.append({"cli": [str(a) for a in train_cli(corpus, tmp / "cli", steps=20, json=True)]})
    (tmp / "runs.json").write_text(json.dumps(spec))
    result = torchrun(str(tmp / "runs.json"), program=(str(REPO / "tests" / "ddp_runs.py"),))
    assert result.returncode == 0, result.stderr
    one_step = {
        name: (data, sets, load_checkpoint(tmp / name / "ddp" / "last.pt").state) for name, (data, sets) in runs.items()
    }
    resumed = {
        name: (corpus, resumable, load_checkpoint(tmp / name / "last.pt").state) for name in ("straight", "resumed")
    }
    return {**one_step, **resumed, "cli": (tmp / "cli", result)}


def test_two_ranks_resume_their_own_checkpoint_exactly(one_step_runs):
    """Each rank's random streams (its windows, its dropout) are saved and restored: a run that stopped and resumed
    under two ranks trains what one that went straight through trained, to the bit."""
    straight, resumed = one_step_runs["straight"][2], one_step_runs["resumed"][2]
    assert resumed["step"] == straight["step"] == 6 and len(resumed["ranks"]) == 2
    assert resumed["model"].keys() == straight["model"].keys()
    assert all(torch.equal(resumed["model"][k], straight["model"][k]) for k in straight["model"])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_two_ranks_of_batch_b_equal_one_process_of_batch_2b_after_one_step(one_step_runs, optimizer):
    corpus, sets, saved = one_step_runs[optimizer]
    ddp_weights = saved["model"]
    # one process, batch 2B: the windows rank 0 and rank 1 drew, the same initial weights, one optimizer step
    config = load_config("tiny", [*sets, f"data.path={corpus}"])
    corpus_ids = Corpus.from_file(corpus, config.data.val_fraction)
    seed_everything(config.train.seed)
    model = Decoder(config.model, corpus_ids.tokenizer.vocab_size)
    windows = [
        RandomWindows(
            corpus_ids.train,
            config.model.block_size,
            config.train.batch_size,
            torch.device("cpu"),
            seed=seed_for_rank(config.train.seed, rank),
        ).next_batch()
        for rank in (0, 1)
    ]
    x, y = torch.cat([w[0] for w in windows]), torch.cat([w[1] for w in windows])
    tc = config.train
    optimizer = make_optimizer(model, tc, torch.device("cpu"))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with same_kernels(tc.cpu_linear):
        _, loss = model(x, y)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
    optimizer.step()
    single = model.state_dict()
    assert set(single) == set(ddp_weights)
    for name, value in single.items():
        assert torch.allclose(value, ddp_weights[name], atol=1e-6, rtol=1e-5), name
    assert not torch.equal(single["tok_emb.weight"], initial["tok_emb.weight"])  # the step did change the weights
    if saved["average"] is not None:  # after one update the average is 2/11 the initial weights, 9/11 the new ones
        assert saved["average"]["updates"] == 1
        for name, value in saved["average"]["weights"].items():
            expected = initial[name] * 2 / 11 + single[name] * 9 / 11
            assert torch.allclose(value, expected, atol=1e-6, rtol=1e-5), name


def _worker_pids(parent: int) -> dict[int, int]:
    """rank -> pid of the processes torchrun started (read from /proc: their RANK environment variable)."""
    ranks = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent:
            for item in env:
                if item.startswith(b"RANK="):
                    ranks[int(item[5:])] = int(proc.name)
    return ranks


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_one_failing_rank_brings_the_job_down_quickly(tmp_path, corpus, sig):
    """Quickly, in steps rather than seconds: both ranks are frozen after rank 0 logged step N, rank 1 gets the
    signal, and once they go on no rank trains past step N + 2; the job ends on the failure itself, never on a
    collective's timeout (10 minutes, more than the hang guard). N + 2, not N + 1: rank 0 may be frozen after step
    N + 1's gradients were exchanged but before it logged the step, while rank 1 has gone on to the next step's
    stop-or-go exchange and given its answer (go) before the signal came."""
    run = tmp_path / "run"
    sets = ["train.eval_interval=5", "train.log_interval=1"]
    job = subprocess.Popen(
        torchrun_args(*train_cli(corpus, run, steps=1000000, quiet=True, config=TINY, sets=sets)),
        env=launch_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + HANG_S  # a guard against a hung job only
        while not (run / "metrics.jsonl").exists():  # the first evaluation: both ranks are training
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.1)
        ranks = _worker_pids(job.pid)
        assert sorted(ranks) == [0, 1], ranks
        for pid in ranks.values():
            freeze(pid)
        last_logged = last_logged_step(run)
        os.kill(ranks[1], sig)
        for pid in ranks.values():
            with contextlib.suppress(ProcessLookupError):  # rank 1 may be gone already
                os.kill(pid, signal.SIGCONT)
        _, err = job.communicate(timeout=HANG_S)
        assert job.returncode != 0
        assert last_logged_step(run) <= last_logged + 2, err  # rank 0 did not train on without rank 1
        assert "timed out" not in err.lower(), err  # as gloo and c10d say when a collective waited in vain
        if sig == signal.SIGTERM:  # the ranks agree to stop at the next step boundary, and rank 0 saves
            assert "SIGTERM received" in err
            assert load_checkpoint(run / "last.pt").step in range(last_logged, last_logged + 3)
    finally:
        if job.poll() is None:
            job.kill()


@pytest.mark.parametrize("kind", ["split", "given-files", "features"])
def test_encoder_decoder_two_ranks_of_batch_b_equal_one_process_of_batch_2b(one_step_runs, kind):
    from charlm.data.pairs import PairCorpus
    from charlm.families.registry import family_for
    from charlm.models.encoder_decoder import EncoderDecoder

    data, sets, saved = one_step_runs[kind]
    ddp_weights = saved["model"]
    config = load_config("tiny", sets + [f"data.path={data}"])
    corpus = PairCorpus.from_config(config.data, config.model.block_size)
    seed_everything(config.train.seed)
    model = EncoderDecoder(config.model, corpus.tokenizer.vocab_size)
    family = family_for(config)  # its batches: the training lines, and any hallucinated ones (features)
    half = [  # the batch each rank drew
        family.batches(config, corpus, torch.device("cpu"), seed_for_rank(config.train.seed, rank)).next_batch()
        for rank in (0, 1)
    ]
    if kind == "features":  # every rank trained on the same synthetic lines after the real ones
        assert len(family.batches(config, corpus, torch.device("cpu"), 0).pairs) == len(corpus.train) + 100
    initial = model.tok_emb.weight.detach().clone()
    optimizer = make_optimizer(model, config.train, torch.device("cpu"))
    # DDP averages the ranks' mean losses (a mean over each rank's target characters): weigh each half as DDP does.
    with same_kernels(config.train.cpu_linear):
        loss = sum(model(s, t, y)[1] for (s, t), y in half) / 2
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
    optimizer.step()
    for name, value in model.state_dict().items():
        assert torch.allclose(value, ddp_weights[name], atol=1e-6, rtol=1e-5), name
    assert not torch.equal(model.tok_emb.weight, initial)  # the step did change the weights


def test_encoder_two_ranks_of_batch_b_equal_one_process_of_batch_2b(one_step_runs):
    from charlm.data.masking import MaskedWindows
    from charlm.models.encoder import Encoder

    corpus, sets, saved = one_step_runs["encoder"]
    ddp_weights = saved["model"]
    config = load_config("tiny", sets + [f"data.path={corpus}"])
    text = Corpus.from_file(corpus, config.data.val_fraction)
    seed_everything(config.train.seed)
    model = Encoder(config.model, text.tokenizer.vocab_size)
    batches = [  # the hidden windows each rank drew, as one batch of 2B
        MaskedWindows(
            text.train,
            config.model.block_size,
            config.train.batch_size,
            torch.device("cpu"),
            seed_for_rank(config.train.seed, rank),
            text.tokenizer.vocab_size,
        ).next_batch()
        for rank in (0, 1)
    ]
    optimizer = make_optimizer(model, config.train, torch.device("cpu"))
    with same_kernels(config.train.cpu_linear):
        loss = sum(model(x, y)[1] for x, y in batches) / 2  # DDP averages each rank's mean over its hidden characters
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
    optimizer.step()
    for name, value in model.state_dict().items():
        assert torch.allclose(value, ddp_weights[name], atol=1e-6, rtol=1e-5), name
