"""charlm on a CUDA GPU, where the machine has one (the rest of the suite hides it: tests/conftest.py): a run trains in
bfloat16 and compiled, its checkpoint opens where no GPU is seen and resumes on the GPU, evaluation and seeded
sampling agree with the CPU's, the compiled decoding step builds, and a torchrun launch takes NCCL. Skipped, saying
so, without a GPU (as in CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, train_cli


def gpu_env() -> dict[str, str]:
    """This process's environment with the GPU shown again."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    hidden = env.pop("CHARLM_TESTS_HID_CUDA", "unset")
    if hidden == "unset":
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = hidden
    return env


def has_gpu() -> bool:
    if not (shutil.which("nvidia-smi") or Path("/dev/nvidiactl").exists()):
        return False  # no driver: no need to start a Python to ask torch
    probe = [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"]
    return subprocess.run(probe, env=gpu_env(), capture_output=True, text=True).stdout.strip() == "True"


pytestmark = [pytest.mark.process, pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")]


def charlm(*args: object, launcher: tuple[str, ...] = ("-m", "charlm")) -> subprocess.CompletedProcess:
    command = [sys.executable, *launcher, *map(str, args)]
    result = subprocess.run(command, env=gpu_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (command, result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory, corpus) -> tuple[Path, dict]:
    """A small model trained 60 steps on the GPU (device auto), and its summary."""
    run = tmp_path_factory.mktemp("gpu") / "run"
    return run, json.loads(charlm(*train_cli(corpus, run, steps=60, json=True)).stdout)


def test_a_run_trains_on_the_gpu_in_bfloat16_and_compiled(gpu_run):
    _, summary = gpu_run
    assert summary["device"].startswith("cuda")
    assert summary["precision"] in ("bfloat16", "float16")  # float16 on a GPU without bfloat16 (not asked: hidden here)
    assert summary["compile_s"] > 0 and summary["steps"] == 60
    assert summary["full_val_loss"] < 3.5  # learned something: the uniform guess over 61 characters is 4.1


def test_its_checkpoint_opens_without_a_gpu_and_resumes_on_it(gpu_run):
    """This process cannot see the GPU: a checkpoint holding CUDA tensors would not load here without map_location."""
    run, _ = gpu_run
    state = torch.load(run / "last.pt", weights_only=True)
    tensors = _tensors(state)  # weights, optimizer, weight average, every rank's random streams
    assert len(tensors) > 10 and all(t.device.type == "cpu" for t in tensors)
    resumed = json.loads(charlm(*train_cli(out=run, resume=True, steps=80, json=True)).stdout)  # compiled again
    assert resumed["steps"] == 80 and resumed["device"].startswith("cuda")
    assert resumed["full_val_loss"] <= gpu_run[1]["full_val_loss"] + 0.05


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for item in value for t in _tensors(item)] if isinstance(value, (list, tuple)) else []


def test_evaluation_and_seeded_sampling_agree_with_the_cpu(gpu_run):
    """float32 decoding on both; the draws are the CPU generator's on both, so the texts are the same (they could part
    only where two characters' logits tie to within the devices' rounding)."""
    run, _ = gpu_run
    scored = {d: json.loads(charlm("eval", run, "--json", "--device", d).stdout)["loss"] for d in ("cuda", "cpu")}
    assert scored["cuda"] == pytest.approx(scored["cpu"], abs=2e-3)
    sample = ("sample", run, "--prompt", "ROMEO:", "--seed", 7, "--temperature", 0.8, "--top-k", 20, "--json")
    texts = {d: json.loads(charlm(*sample, "--max-new-tokens", 60, "--device", d).stdout) for d in ("cuda", "cpu")}
    assert texts["cuda"]["samples"] == texts["cpu"]["samples"]


def test_the_compiled_decoding_step_builds_on_the_gpu(gpu_run):
    run, _ = gpu_run
    result = json.loads(charlm("sample", run, "--compile", "--seed", 1, "--max-new-tokens", 100, "--json").stdout)
    assert result["compile_s"] > 0 and len(result["samples"][0]) > 100


def test_a_torchrun_launch_on_the_gpu_uses_nccl(tmp_path, corpus):
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m", "charlm")
    eager = {"train.compile": "false"}  # compiling is the first test's
    result = charlm(*train_cli(corpus, tmp_path / "ddp", steps=10, json=True, sets=eager), launcher=launcher)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 1 and summary["device"] == "cuda:0" and "nccl" in result.stderr
