"""The speedrun-era model options: QK-norm, ReLU², zero-initialised projections, logit soft-capping."""

import torch
import torch.nn.functional as F

from charlm.config import ModelConfig
from charlm.info import model_info
from charlm.model import GPT

BASE = dict(n_layer=2, n_head=2, n_embd=16, block_size=8)


def test_zero_init_proj_starts_every_block_as_the_identity():
    torch.manual_seed(0)
    model = GPT(ModelConfig(**BASE, zero_init_proj=True), 10)
    for block in model.blocks:
        assert torch.count_nonzero(block.attn.proj.weight) == 0 and torch.count_nonzero(block.mlp.proj.weight) == 0
    x = torch.randint(10, (2, 8))
    h = model.tok_emb(x) + model.pos_emb(torch.arange(8))
    torch.testing.assert_close(model(x)[0], model.head(model.ln_f(h)))


def test_logit_softcap_bounds_the_logits_and_leaves_small_ones_alone():
    torch.manual_seed(0)
    capped = GPT(ModelConfig(**BASE, logit_softcap=0.5), 10)
    plain = GPT(ModelConfig(**BASE), 10)
    plain.load_state_dict(capped.state_dict())
    with torch.no_grad():
        capped.head.weight.mul_(100)
        plain.head.weight.mul_(100)
    x = torch.randint(10, (2, 8))
    assert capped(x)[0].abs().max() <= 0.5 and plain(x)[0].abs().max() > 5
    torch.testing.assert_close(capped(x)[0], 0.5 * torch.tanh(plain(x)[0] / 0.5))


def test_relu2_squares_the_relu():
    torch.manual_seed(0)
    model = GPT(ModelConfig(**BASE, activation="relu2"), 10)
    mlp = model.blocks[0].mlp
    x = torch.randn(3, 16)
    torch.testing.assert_close(mlp(x), mlp.proj(F.relu(mlp.fc(x)) ** 2))


def test_qk_norm_makes_the_scores_independent_of_the_query_scale():
    torch.manual_seed(0)
    model = GPT(ModelConfig(**BASE, qk_norm=True, attention="explicit"), 10).eval()
    x = torch.randint(10, (1, 8))
    before = model.attention_weights(x)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:16].mul_(7.0)  # the query rows
    after = model.attention_weights(x)
    torch.testing.assert_close(before[0], after[0])  # the first layer's input is unchanged


def test_each_option_trains_and_info_names_it():
    for keys in ({"qk_norm": True}, {"activation": "relu2"}, {"zero_init_proj": True}, {"logit_softcap": 15.0}):
        torch.manual_seed(0)
        config = ModelConfig(**BASE, **keys)
        model = GPT(config, 10)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randint(10, (4, 8))
        first = model(x, x)[1].item()
        for _ in range(30):
            opt.zero_grad()
            model(x, x)[1].backward()
            opt.step()
        assert model(x, x)[1].item() < first - 0.5, keys
        info = model_info(config, 10)
        assert info.total_params == sum(p.numel() for p in model.parameters())
        if "activation" not in keys:
            assert any(
                r.formula == "no parameters" and r.component != "positional encoding"
                for r in info.rows
                if "QK-norm" in r.component or "zero-init" in r.component or "soft-cap" in r.component
            ), keys
