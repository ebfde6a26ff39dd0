"""Whole items drawn from a lines model: each sample starts at the start symbol (then the prompt, an item's
beginning) and ends when the model draws the end symbol; max_new_tokens and the context are only caps.

The draw is the one sampler's (temperature, top-k, top-p, a seeded generator), with the padding and start symbols
never drawn: an item holds characters only. `sample_until` draws batch after batch until enough items pass a test
(`charlm sample --novel`: items in none of the run's files).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from charlm.data.tokenizer import Tokenizer
from charlm.decoding.generate import SampleResult, generate_ids
from charlm.decoding.options import DecodeOptions
from charlm.decoding.sampling import sample_next, seeded_generator
from charlm.decoding.stops import StopStrings
from charlm.models.decoder import Decoder

MOST_DRAWS = 50  # `charlm sample --novel` gives up after this many draws per item asked for


@dataclass(frozen=True)
class ItemFrame:
    """How a lines model frames an item: the symbol before it, the symbol that ends it, the ids never drawn, and the
    positions an item may fill with its start symbol (the model's context)."""

    start: int
    end: int
    never: tuple[int, ...]
    room: int

    def prompt(self, prefix: list[int]) -> list[int]:
        """What the model reads first: the start symbol, then the item's beginning."""
        return [self.start, *prefix]

    def cap(self, prefix_length: int, max_new_tokens: int) -> int:
        """Characters drawn at most after the prefix: max_new_tokens, and what an item may hold (the context less
        the start symbol: the model never learnt the end of a longer item)."""
        return max(0, min(max_new_tokens, self.room - 1 - prefix_length))


@dataclass
class DrawnItem:
    text: str  # the prefix and the characters drawn, without the end symbol
    ended: str  # "end": the model drew the end symbol; "stop": a stop string cut it; "length": a cap did


@dataclass
class ItemDraws:
    items: list[DrawnItem]
    drawn: int  # ids drawn over all samples, end symbols included
    seconds: float

    def as_samples(self) -> SampleResult:
        return SampleResult([item.text for item in self.items], self.drawn, self.seconds)


def sample_items(
    model: Decoder,
    tokenizer: Tokenizer,
    frame: ItemFrame,
    prefix: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None = None,
) -> ItemDraws:
    """options.num_samples items drawn together, each from the same prefix; on_text streams item 0's new
    characters. A stop string ends an item just before it, as everywhere else."""
    device = next(model.parameters()).device
    generator = seeded_generator(options.seed)
    never = torch.tensor(frame.never, device=device)

    def choose(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.index_fill(-1, never, float("-inf"))
        return sample_next(logits, generator, options.temperature, options.top_k, options.top_p)

    n = options.num_samples
    texts: list[list[str]] = [[] for _ in range(n)]
    ended = ["length"] * n
    stops = [StopStrings(options.stop) for _ in range(n)]
    drawn = 0
    model.eval()
    started = time.perf_counter()

    def add(i: int, text: str) -> None:
        if text:
            texts[i].append(text)
            if i == 0 and on_text:
                on_text(text)

    cap = frame.cap(len(prefix), options.max_new_tokens)
    done = [False] * n
    # One draw more than the cap: an item of cap characters may still be ended by the end symbol.
    draws = generate_ids(model, frame.prompt(prefix), cap + 1, n, choose, options.use_cache, options.compile)
    for step, next_ids in enumerate(draws):
        for i, token in enumerate(next_ids.tolist()):
            if done[i]:
                continue
            if token == frame.end:
                drawn += 1
                ended[i], done[i] = "end", True
                add(i, stops[i].finish())  # what was held back was not a stop string after all
            elif step == cap:  # a character beyond the cap is not drawn: the item ends at its length
                done[i] = True
            else:
                drawn += 1
                add(i, stops[i].feed(tokenizer.decode([token])))
                if stops[i].stopped:
                    ended[i], done[i] = "stop", True
        if all(done):
            break
    for i in range(n):
        if ended[i] == "length":
            add(i, stops[i].finish())
    seconds = time.perf_counter() - started
    start = tokenizer.decode(prefix)
    return ItemDraws([DrawnItem(start + "".join(t), e) for t, e in zip(texts, ended, strict=True)], drawn, seconds)


def sample_until(
    model: Decoder,
    tokenizer: Tokenizer,
    frame: ItemFrame,
    prefix: list[int],
    options: DecodeOptions,
    keep: Callable[[DrawnItem], bool],
    most: int,
) -> ItemDraws:
    """Items drawn options.num_samples at a time (seeds options.seed, options.seed + 1, ...) until options.num_samples
    of them are kept by `keep`, or `most` have been drawn: the draws in order, up to the one that made the count (all
    of them when none did)."""
    items: list[DrawnItem] = []
    drawn, seconds, kept, batch = 0, 0.0, 0, 0
    while len(items) < most:
        seed = None if options.seed is None else options.seed + batch
        draws = sample_items(model, tokenizer, frame, prefix, options.with_(seed=seed))
        drawn, seconds, batch = drawn + draws.drawn, seconds + draws.seconds, batch + 1
        for item in draws.items:
            items.append(item)
            kept += keep(item)
            if kept == options.num_samples:
                return ItemDraws(items, drawn, seconds)
    return ItemDraws(items, drawn, seconds)
