"""The decoder Transformer itself: causal logits, the initial loss, overfitting one batch, tied weights, scaled
initialisation, RoPE's angles and the CPU dropout mask."""

import math

import pytest
import torch

from charlm.config.schema import ModelConfig
from charlm.models.decoder import Decoder
from charlm.models.layers import Dropout

V = 65


def tiny(**overrides) -> Decoder:
    torch.manual_seed(0)
    return Decoder(ModelConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, **overrides}), V)


def test_logits_have_one_row_per_position():
    model = tiny()
    logits, loss = model(torch.randint(V, (3, 16)))
    assert logits.shape == (3, 16, V) and loss is None


def test_future_tokens_do_not_change_earlier_logits():
    model = tiny().eval()
    x = torch.randint(V, (2, 16))
    changed = x.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % V
    a, _ = model(x)
    b, _ = model(changed)
    assert torch.allclose(a[:, :9], b[:, :9], atol=1e-6)
    assert not torch.allclose(a[:, 9:], b[:, 9:])  # and the mask does not hide the token itself
    assert torch.isfinite(a[:, 0]).all()


def test_position_zero_sees_itself():
    model = tiny().eval()
    x = torch.zeros(1, 4, dtype=torch.long)
    y = x.clone()
    y[0, 0] = 5
    assert not torch.allclose(model(x)[0][:, 0], model(y)[0][:, 0])


def test_initial_loss_is_about_log_vocab():
    model = tiny()
    _, loss = model(torch.randint(V, (8, 16)), torch.randint(V, (8, 16)))
    assert abs(loss.item() - math.log(V)) < 0.15


def test_a_tiny_model_overfits_one_batch():
    model = tiny(dropout=0.0)
    x, y = torch.randint(V, (4, 16)), torch.randint(V, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


def test_too_long_a_sequence_names_both_lengths():
    with pytest.raises(ValueError, match="17.*16"):
        tiny()(torch.zeros(1, 17, dtype=torch.long))


def test_head_is_tied_to_the_token_embedding():
    model = tiny()
    assert model.head.weight is model.tok_emb.weight


def test_residual_projections_get_the_scaled_init():
    model = tiny(n_layer=8, n_embd=64)
    std = model.blocks[0].attn.proj.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(16)) < 0.002
    assert abs(model.blocks[0].attn.qkv.weight.std().item() - 0.02) < 0.002


def test_no_bias_means_no_bias_parameters():
    names = [n for n, _ in tiny(bias=False).named_parameters()]
    assert not any(n.endswith("bias") for n in names)


def test_rope_angles_are_recomputed_for_positions_changed_in_place():
    from charlm.models.layers import Rotary

    rotary, x = Rotary(8), torch.randn(1, 2, 4, 8)
    pos = torch.arange(4)
    first = rotary(x, pos)
    pos += 5
    assert torch.allclose(rotary(x, pos), Rotary(8)(x, torch.arange(5, 9)))
    assert not torch.allclose(rotary(x, pos), first)


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_cpu_dropout_drops_its_share_in_every_lane_and_keeps_the_expectation(p):
    x = torch.ones(64, 128, 128, requires_grad=True)  # 1M elements: the share dropped is within 0.002 of p
    torch.manual_seed(0)
    y = Dropout(p).train()(x)
    dropped = y == 0
    assert abs(dropped.float().mean().item() - p) < 0.002
    # Four draws come from each 64-bit random number: each of the four lanes drops its share (a lane with a
    # constant bit would drop none or twice as many).
    for lane in dropped.flatten().view(-1, 4).float().mean(0).tolist():
        assert abs(lane - p) < 0.004
    kept = y[~dropped]
    assert torch.all(kept == kept[0]) and kept[0].item() == pytest.approx(1 / (1 - p), abs=1e-4)
    assert y.mean().item() == pytest.approx(1.0, abs=0.005)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # the gradient goes through the kept values, scaled alike


def test_cpu_dropout_follows_the_seed_and_is_off_in_eval_mode():
    x = torch.randn(3, 5, 7)  # a size that is not a multiple of four
    dropout = Dropout(0.3).train()
    draws = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        draws.append(dropout(x))
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert torch.equal(dropout.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    wide = torch.ones(6, 4, dtype=torch.bfloat16).t()  # bfloat16 (autocast's), and not contiguous
    halved = Dropout(0.5).train()(wide)
    assert halved.dtype == torch.bfloat16 and halved.shape == (4, 6)
    assert set(halved.flatten().tolist()) <= {0.0, 2.0}
