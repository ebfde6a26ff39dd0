"""The compiled decoding step (`charlm sample --compile`): the same logits as the eager cached loop at every step,
for every position encoding and across window jumps; compiled once per model; mistakes refused in one line."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from conftest import assert_one_line_error, run_cli, with_token_shift_weights

import charlm
from charlm.config.schema import ModelConfig
from charlm.data.tokenizer import CharTokenizer
from charlm.decoding.compiled import compiled_decoder
from charlm.decoding.generate import generate_ids, sample
from charlm.decoding.options import DecodeOptions
from charlm.errors import UsageError
from charlm.models.decoder import Decoder


def forced_steps(model: Decoder, text: torch.Tensor, prompt: int, batch: int, compile: bool):
    """The decoding loop fed the text's own next character in every row: a generator of each step's logits (B, V)."""
    seen: list[torch.Tensor] = []

    def teacher(logits: torch.Tensor) -> torch.Tensor:
        seen.append(logits.clone())
        return text[prompt + len(seen) - 1].expand(batch)

    for _ in generate_ids(model, text[:prompt].tolist(), len(text) - prompt, batch, teacher, compile=compile):
        yield seen[-1]


def forced_logits(model: Decoder, text: torch.Tensor, compile: bool, prompt: int = 3, batch: int = 1) -> torch.Tensor:
    """Every step's logits (N - prompt, B, V)."""
    return torch.stack(list(forced_steps(model, text, prompt, batch, compile)))


def small_model(encoding: str = "rope", **parts) -> Decoder:
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0, pos_encoding=encoding, **parts)
    model = Decoder(config, 20).eval()
    return with_token_shift_weights(model) if config.token_shift else model


OTHER_PARTS = {"n_experts": 2, "attention": "explicit", "norm_position": "post", "qk_norm": True, "logit_softcap": 5.0}


@pytest.mark.parametrize(
    ("encoding", "parts", "prompt", "batch"),
    [
        ("rope", {}, 3, 1),
        ("learned", {}, 3, 1),
        ("alibi", {}, 3, 1),
        ("sinusoidal", OTHER_PARTS, 3, 1),
        ("rope", {"token_shift": True}, 3, 2),
        ("learned", {"token_shift": True}, 20, 2),
        ("rope", {}, 36, 2),  # a prompt beyond what the last position reaches (2 x 15 + 1): a later first position
        ("learned", {}, 20, 2),  # a prompt beyond the context: the window jumps before the first step
    ],
)
def test_compiled_steps_give_the_eager_loops_logits(encoding, parts, prompt, batch):
    """Through a 16-character context to 43 characters: the window rolls (rope, alibi) or jumps and is re-encoded
    (learned, sinusoidal), and every step's logits match the eager cached loop's to float rounding, in every row;
    one case also takes a mixture of experts, written-out attention, post-norm blocks, QK-norm and a logit
    soft-cap, two token shift (each shift point's last input, kept in the static cache by the compiled step)."""
    model, text = small_model(encoding, **parts), torch.randint(0, 20, (43,))
    eager = forced_logits(model, text, False, prompt, batch)
    compiled = forced_logits(model, text, True, prompt, batch)
    assert compiled.shape == eager.shape == (43 - prompt, batch, 20)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


def test_two_loops_at_once_on_one_model_keep_their_own_caches():
    """Two compiled decoding loops interleaved on one model (two generators, or two threads): each gets a cache of
    its own, so each gives the logits it gives alone."""
    model = small_model()
    first, second = torch.randint(0, 20, (30,)), torch.randint(0, 20, (30,))
    alone = [forced_logits(model, text, True) for text in (first, second)]
    together = zip(forced_steps(model, first, 3, 1, True), forced_steps(model, second, 3, 1, True), strict=True)
    for text_index, logits in enumerate(zip(*together, strict=True)):
        torch.testing.assert_close(torch.stack(logits), alone[text_index])


def test_a_decoder_made_under_inference_mode_serves_callers_outside_it():
    model = small_model()
    tokenizer = CharTokenizer([chr(c) for c in range(97, 117)])
    options = DecodeOptions(max_new_tokens=10, seed=3, compile=True)
    with torch.inference_mode():
        inside = sample(model, tokenizer, [0, 1], options)
    assert sample(model, tokenizer, [0, 1], options).samples == inside.samples


def test_a_model_compiles_once_and_a_seed_gives_the_same_text_again():
    model = small_model()  # 50 new characters roll its 16-character window
    tokenizer = CharTokenizer([chr(c) for c in range(97, 117)])
    options = DecodeOptions(max_new_tokens=50, seed=3, compile=True)
    first, second = (sample(model, tokenizer, [0, 1], options) for _ in range(2))
    assert first.compile_seconds > 0 and second.compile_seconds == 0.0  # the second call reused the compiled step
    assert first.samples == second.samples and len(first.samples[0]) == 52
    with compiled_decoder(model, 1, torch.device("cpu"), torch.float32) as decoder:
        assert decoder.ready and decoder.busy
    assert not decoder.busy


def test_int8_weights_compile_too(tiny_checkpoint):
    model = charlm.load(tiny_checkpoint, "cpu", "int8")
    options = DecodeOptions(max_new_tokens=60, seed=0, temperature=0.0)
    eager = model.sample(model.encode_prompt("JULIET:"), options).samples[0]
    compiled = model.sample(model.encode_prompt("JULIET:"), DecodeOptions(**{**vars(options), "compile": True}))
    assert compiled.samples[0][:40] == eager[:40] and len(compiled.samples[0]) == len(eager)


def test_the_cli_flag_reports_compile_time_and_refuses_no_cache(tiny_checkpoint):
    result = run_cli("sample", tiny_checkpoint, "--compile", "--max-new-tokens", "30", "--seed", "2", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["compile_s"] > 0 and out["chars_per_s"] > 0 and len(out["samples"][0]) == 31
    plain = json.loads(run_cli("sample", tiny_checkpoint, "--max-new-tokens", "30", "--seed", "2", "--json").stdout)
    assert "compile_s" not in plain
    assert_one_line_error(
        run_cli("sample", tiny_checkpoint, "--compile", "--no-cache"), 2, "--compile", "leave out --no-cache"
    )
    assert_one_line_error(  # a flag mistake is told before the checkpoint is looked for
        run_cli("sample", "no/such/run", "--compile", "--no-cache"), 2, "leave out --no-cache"
    )
    model = charlm.load(tiny_checkpoint)
    with pytest.raises(UsageError, match="leave out --no-cache"):  # options made in Python are checked too
        model.sample([0], DecodeOptions(use_cache=False, compile=True))


def test_a_platform_that_cannot_compile_is_told_in_one_line():
    """No C++ compiler for inductor's CPU code (a compiler that does not exist, and no cached kernels to fall back
    on): the first step raises a UsageError naming --compile, not a traceback from deep inside torch."""
    import torch._inductor.config as inductor

    torch.manual_seed(2)
    model = Decoder(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, dropout=0.0), 10).eval()
    tokenizer = CharTokenizer([chr(c) for c in range(97, 107)])
    with (
        inductor.patch({"fx_graph_cache": False, "cpp.cxx": ("/nonexistent/c++",)}),  # torch's own, undone after
        pytest.raises(UsageError, match="--compile: torch.compile could not build the decoding step.*leave out"),
    ):
        sample(model, tokenizer, [0], DecodeOptions(max_new_tokens=5, seed=0, compile=True))
    assert inductor.fx_graph_cache and inductor.cpp.cxx != ("/nonexistent/c++",)


def test_a_torch_before_isolate_recompiles_compiles_without_it():
    """torch.compile gained isolate_recompiles in 2.13; charlm supports torch >= 2.6, where passing it is a TypeError
    that would refuse every --compile. The option goes only to a torch.compile that takes it."""
    from charlm.decoding.compiled import compile_options

    def compile_before_2_13(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None):
        return model  # the parameters of torch 2.11's torch.compile, as a signature to read

    assert compile_options(compile_before_2_13) == {}
    takes_it = "isolate_recompiles" in inspect.signature(torch.compile).parameters
    assert compile_options(torch.compile) == ({"isolate_recompiles": True} if takes_it else {})
