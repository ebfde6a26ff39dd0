"""The autocast precision: what train.dtype=auto picks on a CPU, what a run's header and summary say, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, run_cli, train_cli

from charlm.hardware.device import autocast_dtype, cpu_bf16_pays, cpu_bf16_units

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("units", "width", "tokens", "pays"),
    [  # cells of scripts/bench_bf16.py's maps (docs/benchmarks.md; AMX: two machines), and the G2P recipes
        ("amx", 96, 8192, False),  # the default recipe's width: slower in bf16 at every batch on both
        ("amx", 128, 768, False),  # nanoGPT's CPU shape: 0.81x, 0.63x
        ("amx", 128, 256 * 48, False),  # configs/g2p.yaml: 1.2x on one machine, 0.57x on the other
        ("amx", 192, 256 * 48, False),  # configs/g2p-hour.yaml: 0.78x on the second machine
        ("amx", 192, 8192, False),  # 1.20x, 0.85x
        ("amx", 256, 768, False),  # 1.07x, 0.85x
        ("amx", 384, 768, True),  # 1.24x, 1.02x
        ("amx", 384, 8192, True),  # 1.78x, 1.15x
        ("avx512", 96, 8192, False),  # AMD EPYC, two runs of the map: 1.14x and 1.26x
        ("avx512", 128, 768, False),  # 1.06x, 1.04x
        ("avx512", 128, 2048, False),  # 1.10x, 1.21x
        ("avx512", 128, 4096, True),  # 1.22x, 1.12x
        ("avx512", 192, 768, True),  # 1.31x, 1.07x (the rest of 192 wide: 1.25-1.70x)
        ("avx512", 384, 768, True),  # 1.91x, 1.15x
    ],
)
def test_bf16_is_chosen_where_it_was_measured_to_pay(units, width, tokens, pays):
    assert cpu_bf16_pays(width, tokens, units) is pays


@pytest.mark.parametrize(
    ("width", "tokens", "pays"),
    [  # the 2026-11-23 map against float32 on oneDNN's kernels, AMD EPYC (docs/benchmarks.md)
        (96, 2048, False),  # the default recipe: 0.80x
        (192, 8192, False),  # 1.02x
        (256, 8192, False),  # 1.06x
        (384, 768, True),  # 1.06x
        (384, 2048, True),  # 1.11x
    ],
)
def test_against_onednn_float32_avx512_bf16_pays_only_from_384_wide(width, tokens, pays):
    assert cpu_bf16_pays(width, tokens, "avx512", onednn=True) is pays
    assert cpu_bf16_pays(width, tokens, "amx", onednn=True) is cpu_bf16_pays(width, tokens, "amx")  # Intel: MKL's


def test_auto_uses_bf16_on_a_cpu_only_with_bf16_units_and_a_model_that_gains():
    cpuinfo = Path("/proc/cpuinfo")  # Linux; elsewhere there is no run-time check and auto stays float32
    flags = set(cpuinfo.read_text(encoding="utf-8", errors="replace").split()) if cpuinfo.is_file() else set()
    units = "amx" if "amx_bf16" in flags else "avx512" if "avx512_bf16" in flags else None
    assert cpu_bf16_units() == units
    assert autocast_dtype(CPU, "auto", 384, 4096) == (torch.bfloat16 if units else None)
    assert autocast_dtype(CPU, "auto", 96, 2048) is None  # the default model stays float32 everywhere
    assert autocast_dtype(CPU, "float32", 384, 4096) is None
    assert autocast_dtype(CPU, "bfloat16", 96, 2048) == torch.bfloat16  # asked for: given


def test_the_header_and_the_summary_say_which_precision_trained(tmp_path, corpus):
    common = train_cli(corpus, steps=2, json=True, config="tiny")
    wide = ["--set", "model.n_embd=384", "--set", "model.n_head=4", "--set", "model.n_layer=1"]
    narrow = run_cli(*common, "--out-dir", tmp_path / "narrow", check=True)
    assert json.loads(narrow.stdout)["precision"] == "float32"
    assert "precision: float32" in narrow.stderr
    wide_run = run_cli(*common, *wide, "--out-dir", tmp_path / "wide", check=True)
    expected = "bfloat16" if cpu_bf16_units() else "float32"  # 384 wide: bf16 pays on both kinds of units
    assert json.loads(wide_run.stdout)["precision"] == expected
    assert f"precision: {expected}" in wide_run.stderr
    off = run_cli(*common, *wide, "--set", "train.dtype=float32", "--out-dir", tmp_path / "off", check=True)
    assert json.loads(off.stdout)["precision"] == "float32"


def test_float16_on_a_cpu_is_one_line(tmp_path, corpus):
    result = run_cli(
        *train_cli(corpus, tmp_path / "r", steps=1, config="tiny", device="cpu", sets=["train.dtype=float16"])
    )
    assert_one_line_error(result, 2, "float16 is for GPUs")
    assert not (tmp_path / "r").exists()
