"""The speedrun-era model options: QK-norm, ReLU², zero-initialised projections, logit soft-capping, token shift."""

import pytest
import torch
import torch.nn.functional as F
from conftest import with_token_shift_weights

from charlm.config.schema import ModelConfig
from charlm.families.registry import build_model, model_info
from charlm.models.decoder import Decoder
from charlm.models.layers import TokenShift

BASE = dict(n_layer=2, n_head=2, n_embd=16, block_size=8)


def test_zero_init_proj_starts_every_block_as_the_identity():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(**BASE, zero_init_proj=True), 10)
    for block in model.blocks:
        assert torch.count_nonzero(block.attn.proj.weight) == 0 and torch.count_nonzero(block.mlp.proj.weight) == 0
    x = torch.randint(10, (2, 8))
    h = model.tok_emb(x) + model.pos_emb(torch.arange(8))
    torch.testing.assert_close(model(x)[0], model.head(model.ln_f(h)))


def test_logit_softcap_bounds_the_logits_and_leaves_small_ones_alone():
    torch.manual_seed(0)
    capped = Decoder(ModelConfig(**BASE, logit_softcap=0.5), 10)
    plain = Decoder(ModelConfig(**BASE), 10)
    plain.load_state_dict(capped.state_dict())
    with torch.no_grad():
        capped.head.weight.mul_(100)
        plain.head.weight.mul_(100)
    x = torch.randint(10, (2, 8))
    assert capped(x)[0].abs().max() <= 0.5 and plain(x)[0].abs().max() > 5
    torch.testing.assert_close(capped(x)[0], 0.5 * torch.tanh(plain(x)[0] / 0.5))


def test_relu2_squares_the_relu():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(**BASE, activation="relu2"), 10)
    mlp = model.blocks[0].mlp
    x = torch.randn(3, 16)
    torch.testing.assert_close(mlp(x), mlp.proj(F.relu(mlp.fc(x)) ** 2))


def test_qk_norm_makes_the_scores_independent_of_the_query_scale():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(**BASE, qk_norm=True, attention="explicit"), 10).eval()
    x = torch.randint(10, (1, 8))
    before = model.attention_weights(x)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:16].mul_(7.0)  # the query rows
    after = model.attention_weights(x)
    torch.testing.assert_close(before[0], after[0])  # the first layer's input is unchanged


def test_token_shift_adds_each_positions_gated_predecessor_and_starts_as_nothing():
    torch.manual_seed(0)
    shifted = Decoder(ModelConfig(**BASE, token_shift=True), 10)
    plain = Decoder(ModelConfig(**BASE), 10)
    plain.load_state_dict(shifted.state_dict(), strict=False)
    x = torch.randint(10, (2, 8))
    torch.testing.assert_close(shifted(x)[0], plain(x)[0])  # mix starts at zero: the same model at first
    shift = shifted.token_shift
    with torch.no_grad():
        shift.mix.normal_()
        shift.gate.normal_()
    e = torch.randn(2, 5, 16)
    out = shift(e)
    torch.testing.assert_close(out[:, 0], e[:, 0])  # a text's first position has no predecessor
    gate = torch.sigmoid(e[:, 1:] @ shift.gate)[..., None]
    torch.testing.assert_close(out[:, 1:], e[:, 1:] + gate * shift.mix * e[:, :-1])
    assert not torch.allclose(shifted(x)[0], plain(x)[0])


@pytest.mark.parametrize(
    ("arch", "shift_points"),
    [("decoder", 1 + 2), ("encoder", 1 + 2), ("encoder-decoder", 2 + 2 + 2)],  # embeddings + each attention layer
)
def test_token_shift_acts_at_every_shift_point_of_every_family(arch, shift_points):
    """Every TokenShift (the embeddings', each self-attention layer's) is on the loss's path: each of its vectors gets
    a gradient, and the loss moves when any one is changed."""
    torch.manual_seed(0)
    model = with_token_shift_weights(build_model(ModelConfig(**BASE, arch=arch, token_shift=True), 10))
    shifts = [m for m in model.modules() if isinstance(m, TokenShift)]
    assert len(shifts) == shift_points
    x = torch.randint(3, 10, (2, 8))  # clear of the encoder-decoder's special ids 0-2
    args = (x, x, x) if arch == "encoder-decoder" else (x, x)
    loss = model(*args)[1]
    loss.backward()
    for shift in shifts:
        assert shift.mix.grad is not None and shift.mix.grad.abs().sum() > 0
        assert shift.gate.grad is not None and shift.gate.grad.abs().sum() > 0
        with torch.no_grad():
            saved = shift.mix.clone()
            shift.mix.zero_()
            assert model(*args)[1].item() != loss.item()
            shift.mix.copy_(saved)


def test_each_option_trains_and_info_names_it():
    options = ({"qk_norm": True}, {"activation": "relu2"}, {"zero_init_proj": True}, {"logit_softcap": 15.0})
    for keys in (*options, {"token_shift": True}):
        torch.manual_seed(0)
        config = ModelConfig(**BASE, **keys)
        model = Decoder(config, 10)
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
        if "token_shift" in keys:
            assert [r.params for r in info.rows if r.component.startswith("token shift")] == [32, 32]  # 2·d each
        elif "activation" not in keys:
            assert any(
                r.formula == "no parameters" and r.component != "positional encoding"
                for r in info.rows
                if "QK-norm" in r.component or "zero-init" in r.component or "soft-cap" in r.component
            ), keys
