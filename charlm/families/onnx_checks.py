"""Each family's exported graphs checked against its torch model: logits on a few inputs through both runtimes'
own decoding loops (so the same contexts at every step: prompts, single steps, re-encoded or rolling windows), and
greedy output, which must be identical."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from charlm.config.schema import ModelConfig
from charlm.data.tokenizer import BOS, SPECIAL_CHARS
from charlm.decoding.generate import decode_text, draw_samples, generate_ids, sample
from charlm.decoding.options import DecodeOptions
from charlm.decoding.rewrite import rewrite, rewrite_graphs
from charlm.decoding.steps import GraphRuntime, GraphTextSteps, RuntimeCheck
from charlm.families.base import Loaded
from charlm.models.decoder import Decoder
from charlm.models.encoder import Encoder
from charlm.models.encoder_decoder import EncoderDecoder

GREEDY_CHARS = 200  # the greedy text compared, as `charlm sample --temperature 0 --max-new-tokens 200` writes it
CHECK_SEED = 0  # the check's own texts and sources: the same every export


def _random_ids(low: int, high: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(CHECK_SEED * 1000 + seed)
    return torch.randint(low, high, (length,), generator=generator)


def decoder_check(loaded: Loaded, module: Decoder, runtime: GraphRuntime) -> RuntimeCheck:
    """Logits along the greedy text and along a text of 2 x block_size + 5 random characters (prompted by a third
    of it, two rows: a batch), then the greedy text of GREEDY_CHARS characters from a newline."""
    config, tokenizer = loaded.config.model, loaded.tokenizer
    options = DecodeOptions(max_new_tokens=GREEDY_CHARS, temperature=0.0, seed=CHECK_SEED)
    prompt = tokenizer.encode("\n", "skip") or [0]
    ours = sample(module, tokenizer, prompt, options).samples[0]
    theirs = draw_samples(GraphTextSteps(runtime.step, config), tokenizer, prompt, options).samples[0]
    greedy_ids = torch.tensor(prompt + tokenizer.encode(ours[len(tokenizer.decode(prompt)) :], "skip"))
    random_ids = _random_ids(0, tokenizer.vocab_size, 2 * config.block_size + 5, 1)
    (diff_a, steps_a), (diff_b, steps_b) = (
        _teacher_diff(module, runtime, config, greedy_ids, 1),
        _teacher_diff(module, runtime, config, random_ids, 2),
    )
    return RuntimeCheck(
        max(diff_a, diff_b),
        f"logits of {steps_a + 2 * steps_b} steps along two texts (prompts, single steps, windows)",
        f"{GREEDY_CHARS} greedy characters",
        _first_difference(ours, theirs),
    )


def _teacher_diff(
    module: Decoder, runtime: GraphRuntime, config: ModelConfig, text: torch.Tensor, rows: int
) -> tuple[float, int]:
    """The largest logit difference along `text` (rows copies of it), prompted by its first third, both runtimes fed
    the text's own next character at every step; and how many steps were compared."""
    cut = max(1, len(text) // 3)
    prompt, new, rows_text = text[:cut].tolist(), len(text) - cut, text[None].expand(rows, -1)
    ours = _teacher(lambda choose: generate_ids(module, prompt, new, rows, choose), rows_text, cut)
    graph_steps = GraphTextSteps(runtime.step, config)
    theirs = _teacher(lambda choose: decode_text(graph_steps, prompt, new, rows, choose), rows_text, cut)
    return float((ours - theirs).abs().max()), new


def _teacher(loop: Callable[[Callable], Iterator[torch.Tensor]], text: torch.Tensor, cut: int) -> torch.Tensor:
    """Logits (steps, B, V) of a loop prompted by text[:, :cut] and fed the text's own characters after it."""
    seen: list[torch.Tensor] = []

    def teacher(logits: torch.Tensor) -> torch.Tensor:
        seen.append(logits.float().clone())
        return text[:, cut + len(seen) - 1]

    for _ in loop(teacher):
        pass
    return torch.stack(seen)


def _first_difference(ours: str, theirs: str) -> str:
    if ours == theirs:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    return f"character {at}: {ours[at : at + 10]!r} in charlm's, {theirs[at : at + 10]!r} through the export"


def encoder_decoder_check(loaded: Loaded, module: EncoderDecoder, runtime: GraphRuntime) -> RuntimeCheck:
    """Teacher-forced logits of random targets for 4 random sources (one batch, padded), in one pass and step by
    step, then greedy targets of 8 sources."""
    V, block = loaded.tokenizer.vocab_size, loaded.config.model.block_size
    first = len(SPECIAL_CHARS)  # the real characters: never padding, start or end inside a text
    sources = [_random_ids(first, V, 1 + (i * 7) % block, 10 + i).tolist() for i in range(8)]
    src = torch.zeros(4, max(len(s) for s in sources[:4]), dtype=torch.long)
    for row, s in enumerate(sources[:4]):
        src[row, : len(s)] = torch.tensor(s)
    tgt = torch.cat([torch.full((4, 1), BOS), _random_ids(first, V, 4 * (block - 1), 20).view(4, -1)], dim=1)
    with torch.no_grad():
        ours = module(src, tgt)[0].float()
    memory = runtime.encode(src)
    whole = runtime.target_step(tgt, 0, None, memory)[0]
    one_by_one, state = [], None
    for t in range(tgt.size(1)):
        logits, state = runtime.target_step(tgt[:, t : t + 1], t, state, memory)
        one_by_one.append(logits)
    diff = max(float((ours - whole).abs().max()), float((ours - torch.cat(one_by_one, 1)).abs().max()))
    options = DecodeOptions(temperature=0.0, max_new_tokens=block, seed=CHECK_SEED)
    greedy = rewrite(module, sources, options)
    through = rewrite_graphs(runtime, sources, options, block)
    pairs = enumerate(zip(greedy, through, strict=True))
    differs = next((f"source {i}: {a} in charlm's, {b} through the export" for i, (a, b) in pairs if a != b), "")
    return RuntimeCheck(
        diff, f"logits of {tgt.numel()} target positions (whole and step by step)", "8 greedy targets", differs
    )


def encoder_check(loaded: Loaded, module: Encoder, runtime: GraphRuntime) -> RuntimeCheck:
    """Logits of three windows (a batch) with a fifth of their characters hidden, and the characters they restore."""
    V, block = loaded.tokenizer.vocab_size, loaded.config.model.block_size
    ids = _random_ids(0, V, 3 * block, 30).view(3, block)
    hidden = _random_ids(0, 5, 3 * block, 31).view(3, block) == 0
    ids = ids.masked_fill(hidden, module.mask_id)
    with torch.no_grad():
        ours = module(ids)[0].float()
    theirs = runtime.forward(ids)
    diff = float((ours - theirs).abs().max())
    same = bool((ours[..., :V].argmax(-1) == theirs[..., :V].argmax(-1))[hidden].all())
    differs = "" if same else "a hidden character is restored differently"
    return RuntimeCheck(diff, f"logits of {ids.numel()} positions", f"{int(hidden.sum())} hidden characters", differs)
