"""Mixture of experts: routing, the load-balancing loss, parameter counts, and the whole CLI life cycle."""

import json

import torch
from conftest import assert_one_line_error, run_cli, train_cli

from charlm.config.schema import ModelConfig
from charlm.families.registry import model_info
from charlm.models.decoder import Decoder
from charlm.models.layers import MixtureOfExperts

MOE = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, n_experts=4, expert_top_k=2)


def test_each_token_uses_exactly_k_experts_weighted_by_the_router():
    torch.manual_seed(0)
    moe = MixtureOfExperts(MOE)
    x = torch.randn(1, 3, 16)
    out = moe(x)
    probs = torch.softmax(moe.router(x[0]), -1)
    top_p, top_i = probs.topk(2, -1)
    top_p = top_p / top_p.sum(-1, keepdim=True)
    expected = torch.stack([sum(top_p[t, j] * moe.experts[top_i[t, j]](x[0, t]) for j in range(2)) for t in range(3)])
    torch.testing.assert_close(out[0], expected)


def test_the_balance_loss_is_one_when_routing_is_uniform_and_larger_when_skewed():
    moe = MixtureOfExperts(MOE)
    torch.nn.init.zeros_(moe.router.weight)  # every expert equally likely; ties broken the same way
    with torch.no_grad():
        moe(torch.randn(2, 8, 16))
        assert float(moe.aux_loss) == 1.0  # E * sum(f_e * 1/E) = 1 for any f
        moe.router.weight[0] = 10.0  # every token prefers expert 0
        moe(torch.ones(2, 8, 16))
        assert float(moe.aux_loss) > 1.5


def test_the_balance_loss_is_added_only_while_training():
    torch.manual_seed(0)
    model = Decoder(MOE, 10)
    x = torch.randint(10, (2, 8))
    train_loss = model.train()(x, x)[1]
    eval_loss = model.eval()(x, x)[1]
    aux = sum(b.mlp.aux_loss for b in model.blocks) / 2
    torch.testing.assert_close(train_loss, eval_loss + 0.01 * aux)


def test_info_counts_total_and_active_parameters():
    info = model_info(MOE, 10)
    model = Decoder(MOE, 10)
    assert info.total_params == sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for p in model.blocks[0].mlp.experts[0].parameters())
    assert info.active_params == info.total_params - 2 * (4 - 2) * expert


def test_a_mixture_trains_resumes_evaluates_samples_and_reports_its_size(tmp_path, corpus):
    args = train_cli(corpus, tmp_path / "r", json=True, sets=["model.n_experts=4", "model.expert_top_k=2"])
    first = json.loads(run_cli(*args, "--max-steps", "30", check=True).stdout)
    resumed = json.loads(run_cli(*args, "--max-steps", "60", "--resume", check=True).stdout)
    assert resumed["steps"] == 60 and resumed["full_val_loss"] < first["full_val_loss"] < 4.2
    assert json.loads(run_cli("eval", tmp_path / "r", "--json", check=True).stdout)["loss"] > 0
    assert run_cli(
        "sample", tmp_path / "r", "--prompt", "JULIET:", "--max-new-tokens", "20", check=True
    ).stdout.startswith("JULIET:")
    info = json.loads(run_cli("info", tmp_path / "r", "--json", check=True).stdout)
    assert info["active_params"] < info["total_params"]


def test_top_k_above_the_expert_count_is_refused(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", sets=["model.n_experts=2", "model.expert_top_k=3"]))
    assert_one_line_error(result, 2, "model.expert_top_k")
