"""Linear layers through oneDNN on the CPU (train.cpu_linear): the same products and gradients as torch's own
kernel, used only where asked and only for float32 CPU tensors, and said in the training header."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_line_error, run_cli, train_cli

from charlm.models.linear import Linear, OneDNNLinearFunction, linear_words, onednn_linears, onednn_problem, use_onednn

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(onednn_problem() is not None, reason=f"{onednn_problem()}")


def grads(layer: Linear, x: torch.Tensor, onednn: bool) -> tuple[torch.Tensor, ...]:
    """The output and the gradients of input, weight and bias for a fixed upstream gradient."""
    x = x.detach().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with onednn_linears(onednn):
        y = layer(x)
    y.backward(torch.linspace(-1, 1, y.numel()).view_as(y))
    bias = layer.bias.grad if layer.bias is not None else torch.zeros(())
    return y.detach(), x.grad, layer.weight.grad, bias  # type: ignore[return-value]


@needs_onednn
@pytest.mark.parametrize(("fan_in", "fan_out"), [(24, 72), (72, 24), (16, 16)])  # both ways of forming dW
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_gives_torchs_products_and_gradients(fan_in, fan_out, bias):
    torch.manual_seed(0)
    layer = Linear(fan_in, fan_out, bias=bias)
    x = torch.randn(3, 5, fan_in)  # (B, T, C): batch dimensions are kept
    ours, theirs = grads(layer, x, onednn=True), grads(layer, x, onednn=False)
    assert ours[0].shape == (3, 5, fan_out)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_the_onednn_path_runs_only_inside_the_switch_and_only_for_float32_cpu_tensors():
    layer = Linear(8, 4)
    x = torch.randn(2, 8, requires_grad=True)
    with onednn_linears(True):
        assert type(layer(x).grad_fn).__name__ == "OneDNNLinearFunctionBackward"
        with onednn_linears(False):  # switches nest
            assert type(layer(x).grad_fn).__name__ != "OneDNNLinearFunctionBackward"
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast keeps its own bf16 kernels
            y = layer(x)
        assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ != "OneDNNLinearFunctionBackward"
        assert layer.double()(x.double()).dtype == torch.float64  # other dtypes: torch's kernel
        layer.float()
        with torch.inference_mode():  # sampling-style calls work too, with the same numbers
            torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        assert layer(torch.empty(0, 8)).shape == (0, 4)
    assert type(layer(x).grad_fn).__name__ != "OneDNNLinearFunctionBackward"


def test_a_tied_weight_gets_both_uses_gradients():
    if onednn_problem():
        pytest.skip(onednn_problem())
    torch.manual_seed(0)
    layer = Linear(6, 6, bias=False)
    x = torch.randn(4, 6, requires_grad=True)
    with onednn_linears(True):
        OneDNNLinearFunction.apply(layer(x), layer.weight, None).sum().backward()
    expected = layer.weight.grad.clone()
    layer.weight.grad = None
    torch.nn.functional.linear(torch.nn.functional.linear(x, layer.weight), layer.weight).sum().backward()
    torch.testing.assert_close(expected, layer.weight.grad)


def test_train_cpu_linear_chooses_per_device_and_request():
    assert use_onednn(CPU, "torch") is False
    assert use_onednn(torch.device("cuda"), "onednn") is False  # a GPU keeps cuBLAS whatever is asked
    if onednn_problem():
        with pytest.raises(Exception, match="train.cpu_linear=onednn"):
            use_onednn(CPU, "onednn")
    else:
        assert use_onednn(CPU, "onednn") is True
    assert "train.cpu_linear=onednn" in linear_words(True, "onednn")
    assert "train.cpu_linear=torch" in linear_words(False, "torch")


@needs_onednn
def test_a_run_says_which_kernels_trained_and_both_learn_alike(tmp_path, corpus):
    losses = {}
    for kernels in ("onednn", "torch"):
        sets = [f"train.cpu_linear={kernels}"]
        result = run_cli(*train_cli(corpus, tmp_path / kernels, steps=20, json=True, sets=sets), check=True)
        assert ("linear layers: oneDNN" in result.stderr) is (kernels == "onednn"), result.stderr
        summary = json.loads(result.stdout)
        assert summary["linear_kernels"] == kernels
        losses[kernels] = summary["full_val_loss"]
        scored = run_cli("eval", tmp_path / kernels, "--json", check=True)  # the checkpoint's own kernels again
        assert json.loads(scored.stdout)["loss"] == losses[kernels]
    assert losses["onednn"] == pytest.approx(losses["torch"], abs=2e-3)  # float32 both: only rounding differs


def test_an_unknown_cpu_linear_is_one_line(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", sets=["train.cpu_linear=fast"]))
    assert_one_line_error(result, 2, "train.cpu_linear", "onednn")


@needs_onednn
def test_a_compiled_model_traces_whole_with_the_switch_on():
    layer = Linear(8, 4)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)  # a graph break would raise here
    with onednn_linears(True):
        y = compiled(torch.randn(2, 8))
    assert y.shape == (2, 4)


@needs_onednn
def test_a_second_derivative_is_refused_rather_than_wrong():
    layer = Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    with onednn_linears(True):
        (grad,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|twice"):
        grad.sum().backward()


def test_auto_keeps_torchs_kernels_where_the_vendor_is_intel_or_unknown():
    from charlm.models.linear import cpu_vendor

    expected = onednn_problem() is None and cpu_vendor() not in ("", "GenuineIntel")
    assert use_onednn(CPU, "auto") is expected


@needs_onednn
def test_a_bf16_run_reports_torchs_kernels(tmp_path, corpus):
    sets = ["train.dtype=bfloat16", "train.cpu_linear=onednn"]
    result = run_cli(*train_cli(corpus, tmp_path / "r", steps=2, json=True, sets=sets), check=True)
    assert json.loads(result.stdout)["linear_kernels"] == "torch"
    assert "linear layers:" not in result.stderr  # the precision line says bf16 autocast
