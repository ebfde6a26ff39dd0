"""Decoding loops: the KV cache must give exactly the reference path's text under greedy decoding."""

import pytest
import torch

from charlm.config import ModelConfig
from charlm.generate import SampleOptions, generate_ids, sample, window_start
from charlm.model import GPT
from charlm.tokenizer import CharTokenizer

BLOCK = 16


def model(seed=0) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, dropout=0.0), 40).eval()


def greedy(m, prompt, n, use_cache):
    return torch.stack(list(generate_ids(m, prompt, n, 1, lambda logits: logits.argmax(-1), use_cache)), 1)[0].tolist()


@pytest.mark.parametrize("prompt_len", [1, 5, BLOCK, BLOCK + 7, 3 * BLOCK])
@pytest.mark.parametrize("new", [3, BLOCK, 5 * BLOCK])
def test_cached_greedy_equals_uncached_across_the_context_boundary(prompt_len, new):
    m = model()
    prompt = torch.randint(40, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    assert greedy(m, prompt, new, use_cache=True) == greedy(m, prompt, new, use_cache=False)


def test_cache_logits_match_a_full_forward():
    m = model()
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
    options = SampleOptions(max_new_tokens=200, temperature=1.0, seed=3, num_samples=4, stop=["e"])
    result = sample(m, tok, tok.encode("the "), options)
    for text in result.samples:
        generated = text[4:]
        assert (generated.endswith("e") and generated.count("e") == 1) or (
            "e" not in generated and len(generated) == 200
        )
    assert result.generated_chars == sum(len(t) - 4 for t in result.samples)


def test_same_seed_same_text_different_seed_different_text():
    m, tok = model(), _tok()
    texts = [
        sample(m, tok, tok.encode("a"), SampleOptions(max_new_tokens=50, temperature=1.0, seed=s)).samples[0]
        for s in (1, 1, 2)
    ]
    assert texts[0] == texts[1] != texts[2]


def test_zero_new_tokens_returns_the_prompt():
    m, tok = model(), _tok()
    assert sample(m, tok, tok.encode("abc"), SampleOptions(max_new_tokens=0)).samples == ["abc"]
