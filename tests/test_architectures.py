"""Each design choice from the classic Transformer texts, tested on its own."""

import json
import math

import pytest
import torch
from conftest import assert_one_line_error, run_cli, train_cli

from charlm.config.schema import Config, ModelConfig
from charlm.decoding.generate import generate_ids
from charlm.families.registry import model_info
from charlm.models.decoder import Decoder
from charlm.models.layers import Rotary, alibi_slopes, sinusoidal_table
from charlm.storage.checkpoint import load_checkpoint, save_checkpoint

V = 40
BASE = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0)
VARIANTS = {
    "learned": {},
    "sinusoidal": {"pos_encoding": "sinusoidal"},
    "rope": {"pos_encoding": "rope"},
    "alibi": {"pos_encoding": "alibi"},
    "rmsnorm": {"norm": "rmsnorm"},
    "post-ln": {"norm_position": "post"},
    "relu": {"activation": "relu"},
    "swiglu": {"activation": "swiglu"},
    "untied": {"tie_weights": False},
    "no-bias": {"bias": False},
    "ffn-mult-2": {"ffn_mult": 2},
}


def build(seed=0, **overrides) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(ModelConfig(**{**BASE, **overrides}), V)


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_gives_logits_of_the_right_shape(name):
    logits, loss = build(**VARIANTS[name])(torch.randint(V, (3, 16)), torch.randint(V, (3, 16)))
    assert logits.shape == (3, 16, V) and loss.ndim == 0


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_is_causal(name):
    model = build(**VARIANTS[name]).eval()
    x = torch.randint(V, (2, 16))
    changed = x.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % V
    assert torch.allclose(model(x)[0][:, :10], model(changed)[0][:, :10], atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_loss_decreases_over_a_few_steps(name):
    model = build(**VARIANTS[name])
    x, y = torch.randint(V, (8, 16)), torch.randint(V, (8, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3


@pytest.mark.parametrize("name", VARIANTS)
def test_info_total_equals_the_counted_parameters(name):
    config = ModelConfig(**{**BASE, **VARIANTS[name]})
    assert model_info(config, V).total_params == sum(p.numel() for p in Decoder(config, V).parameters())


def greedy(model, prompt, n, use_cache):
    steps = generate_ids(model, prompt, n, 2, lambda logits: logits.argmax(-1), use_cache)
    return torch.stack(list(steps), 1).tolist()


@pytest.mark.parametrize("encoding", ["learned", "sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("prompt_len", [3, 16, 40])
def test_cached_greedy_equals_uncached_across_the_context_boundary(encoding, prompt_len):
    model = build(seed=1, pos_encoding=encoding, n_layer=3).eval()
    prompt = torch.randint(V, (prompt_len,), generator=torch.Generator().manual_seed(7)).tolist()
    assert greedy(model, prompt, 70, use_cache=True) == greedy(model, prompt, 70, use_cache=False)


def test_sinusoidal_values_match_the_formula():
    d = 16
    table = sinusoidal_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            assert math.isclose(table[pos, 2 * i].item(), math.sin(pos / 10000 ** (2 * i / d)), abs_tol=1e-5)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(pos / 10000 ** (2 * i / d)), abs_tol=1e-5)


def test_sinusoidal_rope_and_alibi_add_no_parameters():
    learned = build().num_params()
    for encoding in ("sinusoidal", "rope", "alibi"):
        model = build(pos_encoding=encoding)
        assert model.num_params() == learned - 16 * 32
        assert not any("pos" in k for k in model.state_dict())


def test_rope_scores_depend_only_on_relative_position():
    rotary = Rotary(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m, n):
        return (rotary(q, torch.tensor([m])) * rotary(k, torch.tensor([n]))).sum().item()

    assert math.isclose(score(5, 2), score(105, 102), rel_tol=1e-4)
    assert not math.isclose(score(5, 2), score(5, 4), rel_tol=1e-3)


def test_alibi_slopes_follow_the_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # not a power of two: the 4-head slopes, then every other slope of the 8-head series (the paper's code)
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


def test_rmsnorm_blocks_use_rmsnorm():
    model = build(norm="rmsnorm")
    assert isinstance(model.blocks[0].ln_1, torch.nn.RMSNorm)


def test_post_ln_and_pre_ln_differ_for_the_same_weights():
    pre = build(norm_position="pre").eval()
    post = build(norm_position="post").eval()
    missing, unexpected = post.load_state_dict(pre.state_dict(), strict=False)
    assert missing == [] and unexpected == ["ln_f.weight", "ln_f.bias"]  # post-LN has no final norm
    x = torch.randint(V, (2, 16))
    assert not torch.allclose(pre(x)[0], post(x)[0], atol=1e-3)


def test_untied_head_has_its_own_weights():
    model = build(tie_weights=False)
    assert model.head.weight is not model.tok_emb.weight
    assert model.num_params() == build().num_params() + V * 32


def test_swiglu_hidden_width_keeps_parameter_counts_comparable():
    gelu, swiglu = build().num_params(), build(activation="swiglu").num_params()
    assert abs(swiglu - gelu) / gelu < 0.02


def test_textbook_base_size_rows():
    d, d_ff = 512, 2048
    for heads in (1, 8, 64):  # the attention count does not depend on h: the heads split d, they add nothing
        config = ModelConfig(n_layer=6, n_head=heads, n_embd=512, block_size=512, activation="relu")
        rows = {r.component.split(" (")[0]: r for r in model_info(config, 65).rows}
        assert rows["attention Q/K/V/output"].params == 4 * d * d + 4 * d, heads
    assert rows["feed-forward"].params == 2 * d * d_ff + d_ff + d
    assert rows["feed-forward"].formula == "2·d·d_ff + d_ff + d"


def test_checkpoint_written_before_the_architecture_keys_loads_with_the_old_behaviour(tmp_path):
    old_config = Config(model=ModelConfig(**BASE)).to_dict()
    for key in ("pos_encoding", "norm", "norm_position", "activation", "ffn_mult", "tie_weights"):
        del old_config["model"][key]
    model = build()
    save_checkpoint(
        tmp_path / "old.pt",
        {"config": old_config, "vocab": [chr(65 + i) for i in range(V)], "model": model.state_dict(), "step": 1},
    )
    loaded = load_checkpoint(tmp_path / "old.pt")
    assert loaded.config.model.pos_encoding == "learned" and loaded.config.model.tie_weights
    x = torch.randint(V, (1, 16))
    assert torch.equal(loaded.build_model().eval()(x)[0], model.eval()(x)[0])


def test_rope_needs_an_even_head_size():
    from charlm.config.build import load_config
    from charlm.errors import UsageError

    with pytest.raises(UsageError, match="even head size"):
        load_config(None, ["model.pos_encoding=rope", "model.n_embd=30", "model.n_head=2"])


def test_info_cli_for_the_gpu_config_shows_about_10_7m(tmp_path):
    table = run_cli("info", "--config", "gpu", check=True).stdout
    assert "10,745,088" in table
    figures = json.loads(run_cli("info", "--config", "gpu", "--json", check=True).stdout)
    assert figures["total_params"] == 10_745_088 and figures["flops_per_token"] > 6 * 10_000_000


def test_info_vocab_size_goes_with_a_config_only(tmp_path, tiny_checkpoint):
    """A checkpoint has its vocabulary, and a byte tokenizer's is 256: --vocab-size is refused there, not ignored."""
    assert_one_line_error(run_cli("info", tiny_checkpoint, "--vocab-size", "10"), 2, "--vocab-size", "not both")
    byte = run_cli("info", "-c", "tiny", "--set", "data.tokenizer=byte", "--vocab-size", "5")
    assert_one_line_error(byte, 2, "--vocab-size 5", "vocabulary is 256")
    plain, wider = (run_cli("info", "-c", "tiny", *v, "--json", check=True) for v in ([], ["--vocab-size", "70"]))
    assert json.loads(wider.stdout)["total_params"] > json.loads(plain.stdout)["total_params"]


@pytest.mark.parametrize("encoding", ["rope", "alibi", "sinusoidal"])
def test_variants_train_resume_eval_sample_and_info_through_the_cli(tmp_path, corpus, encoding):
    run = tmp_path / encoding
    sets = [f"model.pos_encoding={encoding}", "model.norm=rmsnorm", "model.activation=swiglu"]
    run_cli(*train_cli(corpus, run, steps=10, sets=sets), check=True)
    run_cli(*train_cli(out=run, resume=True, steps=20), check=True)
    ckpt = load_checkpoint(run / "last.pt")
    assert ckpt.step == 20 and ckpt.config.model.pos_encoding == encoding
    assert json.loads(run_cli("eval", run / "best.pt", "--json", check=True).stdout)["chars"] > 0
    sample = run_cli("sample", run / "best.pt", "--max-new-tokens", "50", "--seed", "1", "--json", check=True)
    assert len(json.loads(sample.stdout)["samples"][0]) == 51
    info = json.loads(run_cli("info", run / "best.pt", "--json", check=True).stdout)
    assert info["total_params"] == ckpt.build_model().num_params()
