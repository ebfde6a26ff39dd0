"""Attention written out: the explicit path equals the fused kernel, and its weights obey the causal mask exactly;
dropout of the attention weights is model.attention_dropout's on every path."""

import json

import pytest
import torch
from conftest import assert_one_line_error, run_cli

from charlm.config.schema import ModelConfig
from charlm.decoding.generate import generate_ids
from charlm.models.attention import Attention, attention_mask
from charlm.models.decoder import Decoder

V = 11
ENCODINGS = ["learned", "sinusoidal", "rope", "alibi"]


def _pair(encoding: str, **keys) -> tuple[Decoder, Decoder]:
    """The same weights behind the fused and the explicit path."""
    torch.manual_seed(0)
    config = dict(n_layer=2, n_head=4, n_embd=32, block_size=12, pos_encoding=encoding, **keys)
    fused = Decoder(ModelConfig(**config, attention="fused"), V).eval()
    explicit = Decoder(ModelConfig(**config, attention="explicit"), V).eval()
    explicit.load_state_dict(fused.state_dict())
    return fused, explicit


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_explicit_attention_matches_the_fused_kernel(encoding):
    fused, explicit = _pair(encoding)
    x = torch.randint(V, (3, 12))
    torch.testing.assert_close(explicit(x)[0], fused(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_explicit_attention_matches_with_the_kv_cache_past_the_context(encoding):
    fused, explicit = _pair(encoding)
    prompt = [1, 2, 3, 4, 5]
    greedy = lambda logits: logits.argmax(-1)  # noqa: E731
    for use_cache in (True, False):
        a = torch.stack(list(generate_ids(fused, prompt, 30, 1, greedy, use_cache)))
        b = torch.stack(list(generate_ids(explicit, prompt, 30, 1, greedy, use_cache)))
        assert torch.equal(a, b)


def _weights(encoding: str, T: int = 12) -> torch.Tensor:
    _, explicit = _pair(encoding)
    return explicit.attention_weights(torch.randint(V, (2, T)))  # (L, B, nh, T, T)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_attention_rows_sum_to_one(encoding):
    w = _weights(encoding)
    assert w.shape == (2, 2, 4, 12, 12)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 4, 12))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_nothing_above_the_diagonal_is_attended(encoding):
    w = _weights(encoding)
    future = torch.triu(torch.ones(12, 12, dtype=torch.bool), diagonal=1)
    assert (w[..., future] == 0).all()  # exactly zero, not merely small


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_first_position_attends_only_to_itself(encoding):
    w = _weights(encoding)
    first_row = torch.zeros(12)
    first_row[0] = 1.0
    assert torch.equal(w[..., 0, :], first_row.expand_as(w[..., 0, :]))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_position_attends_to_itself(encoding):
    """Fails with the strict mask torch.tril(ones, -1) of one well-known notebook: the diagonal would be 0 and the
    first row would have nothing to attend to (NaN)."""
    w = _weights(encoding)
    diagonal = w.diagonal(dim1=-2, dim2=-1)
    assert torch.isfinite(w).all() and (diagonal > 0).all()


def test_the_mask_keeps_the_diagonal_and_the_window():
    pos = torch.arange(6)
    mask = attention_mask(pos, pos, window=3, slopes=None, dtype=torch.float32)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    assert not torch.equal(mask, torch.tril(torch.ones(6, 6), -1).bool())


def test_attention_command_draws_a_png_and_prints_json(tiny_checkpoint, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "attn.png"
    result = run_cli("attention", tiny_checkpoint, "--prompt", "ROMEO: ", "-o", out, check=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "1 layers x 2 heads" in result.stderr
    data = json.loads(run_cli("attention", tiny_checkpoint, "--prompt", "ROMEO: ", "--json", check=True).stdout)
    w = torch.tensor(data["weights"])
    assert data["chars"] == list("ROMEO: ") and w.shape == (1, 2, 7, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 7))
    assert (w[..., torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)] == 0).all()
    one = json.loads(
        run_cli("attention", tiny_checkpoint, "--prompt", "AB", "--head", "1", "--json", check=True).stdout
    )
    assert one["heads"] == [1] and torch.tensor(one["weights"]).shape == (1, 1, 2, 2)


def test_attention_command_refuses_what_it_cannot_show(tiny_checkpoint, tmp_path):
    assert_one_line_error(run_cli("attention", tiny_checkpoint, "--layer", "5"), 2, "--layer 5")
    assert_one_line_error(run_cli("attention", tiny_checkpoint, "--prompt", "x" * 40), 2, "context is 16")
    unseen = run_cli("attention", tiny_checkpoint, "--prompt", "Rö", "--json")
    assert_one_line_error(unseen, 2, "'ö' (U+00F6)", "leave them out")
    assert "--unknown" not in unseen.stderr  # an option attention does not have
    folder = run_cli("attention", tiny_checkpoint, "-o", tmp_path)  # refused before any work, the folder as it was
    assert_one_line_error(folder, 2, f"--output {tmp_path} is a folder", "plot.png")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kernel", ["fused", "explicit"])
@pytest.mark.parametrize(
    "dropout, attention_dropout, drops",
    [(0.5, None, True), (0.5, 0.0, False), (0.0, 0.5, True), (0.0, None, False)],
    ids=["null-is-model.dropout", "0-drops-none", "its-own-rate", "none"],
)
def test_attention_dropout_drops_the_weights_on_every_path(kernel, dropout, attention_dropout, drops):
    """In training, attention weights are dropped at model.attention_dropout (null: model.dropout), whatever the
    residual stream's rate: on the causal path without a mask (the fused kernel's own) and through a mask (padding,
    cross-attention, ALiBi), fused or written out. Two calls agree exactly when nothing is dropped."""
    torch.manual_seed(0)
    keys = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, pos_encoding="learned", attention=kernel)
    attention = Attention(ModelConfig(**keys, dropout=dropout, attention_dropout=attention_dropout), "causal")
    attention.resid_dropout = torch.nn.Identity()  # the residual stream's dropout is another layer's business
    attention.train()
    x, pos = torch.randn(2, 8, 16), torch.arange(8)
    q, k, v = (torch.randn(2, 2, 8, 8) for _ in range(3))
    mask = torch.zeros(8, 8)
    for run in (lambda: attention(x, pos), lambda: attention.attend(q, k, v, mask)):
        assert torch.equal(run(), run()) != drops
    assert torch.equal(attention.eval()(x, pos), attention(x, pos))  # evaluation never drops
