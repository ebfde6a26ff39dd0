"""Decoding loops: the KV cache must give exactly the reference path's text under greedy decoding."""

import pytest
import torch
from conftest import with_token_shift_weights

from charlm.config.schema import ModelConfig
from charlm.data.tokenizer import CharTokenizer
from charlm.decoding.generate import generate_ids, sample
from charlm.decoding.options import DecodeOptions
from charlm.decoding.window import window_start
from charlm.models.decoder import Decoder

BLOCK = 16


def model(seed=0, **parts) -> Decoder:
    torch.manual_seed(seed)
    built = Decoder(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, dropout=0.0, **parts), 40).eval()
    return with_token_shift_weights(built) if parts.get("token_shift") else built


def greedy(m, prompt, n, use_cache):
    return torch.stack(list(generate_ids(m, prompt, n, 1, lambda logits: logits.argmax(-1), use_cache)), 1)[0].tolist()


@pytest.mark.parametrize("prompt_len", [1, 5, BLOCK, BLOCK + 7, 3 * BLOCK])
@pytest.mark.parametrize("new", [3, BLOCK, 5 * BLOCK])
def test_cached_greedy_equals_uncached_across_the_context_boundary(prompt_len, new):
    m = model()
    prompt = torch.randint(40, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    assert greedy(m, prompt, new, use_cache=True) == greedy(m, prompt, new, use_cache=False)


@pytest.mark.parametrize("pos_encoding", ["rope", "learned"])
@pytest.mark.parametrize("prompt_len", [1, BLOCK + 7, 3 * BLOCK])
def test_token_shift_cached_greedy_equals_uncached(pos_encoding, prompt_len):
    """The cache carries each shift point's last input into the next step; a rolling window (rope) and a re-encoded
    one (learned) give the reference loop's text, whose windows start without a predecessor as in training."""
    m = model(token_shift=True, pos_encoding=pos_encoding)
    prompt = torch.randint(40, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    assert greedy(m, prompt, 5 * BLOCK, use_cache=True) == greedy(m, prompt, 5 * BLOCK, use_cache=False)


def forced_logits(m: Decoder, text: torch.Tensor, prompt: int, use_cache: bool) -> torch.Tensor:
    """Every step's logits (N - prompt, V) of the decoding loop fed the text's own next character."""
    seen: list[torch.Tensor] = []

    def teacher(logits: torch.Tensor) -> torch.Tensor:
        seen.append(logits[0].clone())
        return text[prompt + len(seen) - 1 : prompt + len(seen)]

    for _ in generate_ids(m, text[:prompt].tolist(), len(text) - prompt, 1, teacher, use_cache):
        pass
    return torch.stack(seen)


@pytest.mark.parametrize("pos_encoding", ["rope", "learned"])
def test_token_shift_cached_logits_equal_the_reference_loops(pos_encoding):
    """Every step's logits, not only the greedy text: the rolling cache carries each shift point's last input, and
    the reference loop (rope) encodes as far back as the last position reaches, one position more per shift point."""
    m = model(token_shift=True, pos_encoding=pos_encoding)
    text = torch.randint(40, (6 * BLOCK,), generator=torch.Generator().manual_seed(3))
    cached, reference = forced_logits(m, text, 3, True), forced_logits(m, text, 3, False)
    torch.testing.assert_close(cached, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("token_shift", [False, True])
def test_cache_logits_match_a_full_forward(token_shift):
    m = model(token_shift=token_shift)
    x = torch.randint(40, (2, 12))
    cache = m.new_cache(2, torch.device("cpu"))
    m(x[:, :7], cache=cache)
    step_logits = [m(x[:, i : i + 1], cache=cache)[0][:, -1] for i in range(7, 12)]
    full = m(x)[0][:, 7:]
    assert torch.allclose(torch.stack(step_logits, 1), full, atol=1e-5)


def test_window_policy_keeps_the_last_half_when_full():
    assert window_start(16, 0, 16) == 0
    assert window_start(17, 0, 16) == 9  # 8 = block // 2 characters kept
    assert window_start(20, 9, 16) == 9
    assert window_start(26, 9, 16) == 18


def _tok():
    return CharTokenizer([chr(ord("a") + i) for i in range(26)] + list(" .,;:!?\n'-ABCDEF")[:14])


def test_stop_strings_end_each_sample_on_its_own():
    m, tok = model(), _tok()
    options = DecodeOptions(max_new_tokens=200, temperature=1.0, seed=3, num_samples=4, stop=["e"])
    result = sample(m, tok, tok.encode("the "), options)
    stopped = 0
    for text in result.samples:
        generated = text[4:]
        assert "e" not in generated  # the stop string ends the text and is left out (OpenAI's rule)
        stopped += len(generated) < 200
    assert stopped > 0  # each stopped sample generated its "e", then left it out
    assert result.generated_chars == sum(len(t) - 4 for t in result.samples) + stopped


def test_same_seed_same_text_different_seed_different_text():
    m, tok = model(), _tok()
    texts = [
        sample(m, tok, tok.encode("a"), DecodeOptions(max_new_tokens=50, temperature=1.0, seed=s)).samples[0]
        for s in (1, 1, 2)
    ]
    assert texts[0] == texts[1] != texts[2]


def test_zero_new_tokens_returns_the_prompt():
    m, tok = model(), _tok()
    assert sample(m, tok, tok.encode("abc"), DecodeOptions(max_new_tokens=0)).samples == ["abc"]
