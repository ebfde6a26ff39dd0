"""int8 weights for decoding (models/quantize.py, `--precision int8`): close to float32, opt-in, refused off the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_line_error, run_cli
from torch import nn

import charlm
from charlm.decoding.generate import teacher_forced
from charlm.errors import UsageError
from charlm.models.quantize import Int8Linear, for_decoding, quantize_linears


@pytest.mark.parametrize(("width_in", "width_out", "rows"), [(16, 5, 1), (96, 256, 7), (384, 65, 3)])
def test_an_int8_linear_computes_what_the_float_one_does(width_in, width_out, rows):
    torch.manual_seed(0)
    linear = nn.Linear(width_in, width_out)
    x = torch.randn(2, rows, width_in)
    with torch.inference_mode():
        want, got = linear(x), Int8Linear(linear)(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).abs().max() < 0.02 * want.abs().max()  # int8 rows and a bfloat16 input: ~0.5% here
    assert not torch.equal(got, want)  # it really is the int8 kernel


def test_every_linear_is_replaced_but_those_the_kernel_cannot_take():
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Sequential(nn.Linear(48, 24), nn.Linear(24, 3)))
    assert quantize_linears(model) == 2
    assert [type(m).__name__ for m in model.modules() if not isinstance(m, nn.Sequential | nn.ReLU)] == [
        "Int8Linear",
        "Int8Linear",
        "Linear",  # 24 inputs: not a multiple of 16, which torch's AVX-512 kernel needs
    ]


def test_int8_off_the_cpu_is_one_clear_error():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(32, 32))
    with pytest.raises(UsageError, match="decodes on the CPU.*--device cpu"):
        for_decoding(model, "int8")
    with pytest.raises(UsageError, match="float32, int8"):
        for_decoding(model, "int4")


def test_int8_ranks_the_next_character_as_float32_does(tiny_checkpoint, corpus):
    """Teacher-forced over 400 characters of the text, int8 and float32 put the same character first nearly always,
    and their losses differ by little."""
    text = torch.tensor(charlm.load(tiny_checkpoint).encode_prompt(corpus.read_text()[:401]))
    found = {}
    for precision in ("float32", "int8"):
        model = charlm.load(tiny_checkpoint, "cpu", precision)
        assert any(isinstance(m, Int8Linear) for m in model.module.modules()) == (precision == "int8")
        found[precision] = teacher_forced(model.decoder, text)
    (firsts32, loss32), (firsts8, loss8) = found["float32"], found["int8"]
    assert len(firsts32) == len(firsts8) == 400
    assert sum(a == b for a, b in zip(firsts32, firsts8, strict=True)) >= 0.97 * 400
    assert 1.0 < loss32 < 4.0 and abs(loss8 - loss32) < 0.02


def test_sample_and_eval_take_precision_and_float32_stays_the_default(tiny_checkpoint):
    common = ["--prompt", "ROMEO:", "--seed", "3", "--max-new-tokens", "60", "--json"]
    default = json.loads(run_cli("sample", tiny_checkpoint, *common, check=True).stdout)
    float32 = json.loads(run_cli("sample", tiny_checkpoint, *common, "--precision", "float32", check=True).stdout)
    int8 = json.loads(run_cli("sample", tiny_checkpoint, *common, "--precision", "int8", check=True).stdout)
    assert default["samples"] == float32["samples"]
    assert int8["samples"][0].startswith("ROMEO:") and len(int8["samples"][0]) == len("ROMEO:") + 60
    scored = {
        p: json.loads(run_cli("eval", tiny_checkpoint, "--precision", p, "--json", check=True).stdout)["loss"]
        for p in ("float32", "int8")
    }
    assert scored["float32"] != scored["int8"] and abs(scored["float32"] - scored["int8"]) < 0.02


def test_a_wrong_precision_names_the_choices(tiny_checkpoint):
    result = run_cli("sample", tiny_checkpoint, "--precision", "int4")
    assert result.returncode == 2
    assert "int4" in result.stderr and "float32" in result.stderr and "int8" in result.stderr
    assert "Traceback" not in result.stderr


def test_int8_on_a_gpu_device_is_refused_in_one_line(tiny_checkpoint):
    result = run_cli("sample", tiny_checkpoint, "--device", "cuda", "--precision", "int8")
    # With a GPU, charlm.models.quantize refuses int8 there; without one (CI), the device itself is refused first.
    assert_one_line_error(result, 2, "--device cpu" if torch.cuda.is_available() else "no CUDA GPU")


def test_a_mixtures_routers_stay_float32_and_a_model_with_nothing_to_quantize_is_refused():
    from charlm.config.build import load_config
    from charlm.models.decoder import Decoder
    from charlm.models.layers import MixtureOfExperts

    moe = Decoder(load_config("tiny", ["model.n_experts=2", "model.expert_top_k=1", "model.n_embd=32"]).model, 10)
    for_decoding(moe.eval(), "int8")
    routers = [m.router for m in moe.modules() if isinstance(m, MixtureOfExperts)]
    assert routers and all(isinstance(r, nn.Linear) for r in routers)
    assert isinstance(moe.head, nn.Linear) and any(isinstance(m, Int8Linear) for m in moe.modules())
    odd = Decoder(load_config("tiny", ["model.n_embd=18", "model.n_head=2"]).model, 10)  # feed-forward: 72 wide
    with pytest.raises(UsageError, match="nothing to quantize.*multiples of 16"):
        for_decoding(odd.eval(), "int8")
