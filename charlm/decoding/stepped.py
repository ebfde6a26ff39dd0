"""Decoding through a step that takes its state and hands back the next one as tensors (an ONNX export's graph run
by onnxruntime): the same windowing policy, sampler and stop strings as the torch loops, so greedy text is charlm's.

A step is `step(ids (B, T), start, state) -> (logits (B, T, V), state)`, `state` None for a fresh text (or a
re-encoded window); positions start at `start`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from charlm.config.schema import ModelConfig
from charlm.data.tokenizer import BOS, EOS, PAD, Tokenizer
from charlm.decoding.generate import (
    ChooseNext,
    ContextWindow,
    SampleResult,
    collect_samples,
    id_buffer,
    seeded_chooser,
    with_room,
)
from charlm.decoding.options import DecodeOptions
from charlm.decoding.sampling import sample_next

State = Any  # whatever the runtime keeps between steps (onnxruntime's output arrays)
Step = Callable[[torch.Tensor, int, State], tuple[torch.Tensor, State]]


class GraphRuntime(Protocol):
    """What a runtime of an export's graphs answers (charlm/storage/onnx_runtime.py's OnnxRuntime)."""

    def step(self, ids: torch.Tensor, start: int, state: State) -> tuple[torch.Tensor, State]: ...

    def forward(self, ids: torch.Tensor) -> torch.Tensor: ...

    def encode(self, src: torch.Tensor) -> State: ...

    def target_step(self, tgt: torch.Tensor, start: int, state: State, memory: State) -> tuple[torch.Tensor, State]: ...


@dataclass
class RuntimeCheck:
    """An export checked against charlm's own model: the largest logit difference, and whether greedy decoding gave
    the same text (`greedy`: what was compared; `differs`: where they part, "" when equal)."""

    max_abs_diff: float
    compared: str
    greedy: str
    differs: str = ""


def stepped_ids(
    step: Step, config: ModelConfig, prompt: list[int], max_new_tokens: int, batch: int, choose: ChooseNext
) -> Iterator[torch.Tensor]:
    """Yield the next ids (B,) step by step, every row continuing the prompt (generate_ids' loop, its policy)."""
    tokens = id_buffer(prompt, max_new_tokens, batch)
    window, n = ContextWindow(config), len(prompt)
    state: State = None
    length = 0  # the position the next new token takes
    for _ in range(max_new_tokens):
        if state is None or window.jumps(n):  # a first chunk, or a window that jumped: encoded afresh
            first = window.advance(n)
            length = window.position(first)
            logits, state = step(tokens[:, first:n], length, None)
            length += n - first
        else:
            logits, state = step(tokens[:, n - 1 : n], length, state)
            length += 1
        next_ids = choose(logits[:, -1])  # (B,)
        tokens = with_room(tokens, n)
        tokens[:, n] = next_ids
        n += 1
        yield next_ids


def sample_stepped(
    step: Step,
    config: ModelConfig,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None = None,
) -> SampleResult:
    """generate.sample through a step: num_samples continuations in one batch, sample 0 streamed to on_text."""
    choose = seeded_chooser(options)
    started = time.perf_counter()
    steps = stepped_ids(step, config, prompt_ids, options.max_new_tokens, options.num_samples, choose)
    return collect_samples(steps, tokenizer, prompt_ids, options, on_text, started)


def transduce_stepped(
    encode: Callable[[torch.Tensor], State],
    step: Callable[[torch.Tensor, int, State, State], tuple[torch.Tensor, State]],
    sources: list[list[int]],
    options: DecodeOptions,
    limit: int,
) -> list[list[int]]:
    """transduce's greedy or sampled decoding through an encoder and a target step: each source's target ids
    (without BOS/EOS), in the order given. encode(src (B, S)) -> memory; step(tgt (B, 1), start, state, memory)."""
    generator = torch.Generator()
    generator.manual_seed(options.seed if options.seed is not None else torch.seed())
    results: dict[int, list[int]] = {}
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths together: less padding
    for first in range(0, len(order), options.batch_size):
        chosen = order[first : first + options.batch_size]
        width = max(len(sources[i]) for i in chosen)
        src = torch.full((len(chosen), width), PAD, dtype=torch.long)
        for row, i in enumerate(chosen):
            src[row, : len(sources[i])] = torch.tensor(sources[i])
        memory, state = encode(src), None
        token = torch.full((len(chosen), 1), BOS, dtype=torch.long)
        out: list[list[int]] = [[] for _ in chosen]
        done = torch.zeros(len(chosen), dtype=torch.bool)
        for position in range(min(options.max_new_tokens, limit)):
            logits, state = step(token, position, state, memory)
            logits = logits[:, -1].float()
            logits[:, [PAD, BOS]] = -math.inf  # never written inside a target
            nxt = sample_next(logits, generator, options.temperature, options.top_k, options.top_p)
            for row, t in enumerate(nxt.tolist()):
                if not done[row] and t != EOS:
                    out[row].append(t)
            done |= nxt == EOS
            if bool(done.all()):
                break
            token = nxt[:, None]
        results.update(zip(chosen, out, strict=True))
    return [results[i] for i in range(len(sources))]
