"""Text generation: the decoding loop of every runtime (a KV cache, a compiled step, an export's graphs), and
the samples drawn through it: the seeded chooser, stop strings, streaming (the windowing policy: window.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from charlm.data.tokenizer import Tokenizer, UnknownPolicy
from charlm.decoding.compiled import compiled_decoder
from charlm.decoding.options import DecodeOptions, check_values
from charlm.decoding.sampling import sample_next, seeded_generator
from charlm.decoding.steps import ModuleTextSteps, TextSteps
from charlm.decoding.stops import StopStrings
from charlm.errors import UsageError
from charlm.models.decoder import Decoder

ChooseNext = Callable[[torch.Tensor], torch.Tensor]  # logits (B, V) -> ids (B,)


@torch.inference_mode()
def generate_ids(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    batch: int,
    choose: ChooseNext,
    use_cache: bool = True,
    compile: bool = False,
) -> Iterator[torch.Tensor]:
    """Yield the next ids (B,) step by step, every row continuing the same prompt; `compile`: single positions go
    through a compiled step with a cache of its own (charlm/decoding/compiled.py)."""
    with module_steps(model, batch, use_cache, compile) as steps:
        yield from decode_text(steps, prompt, max_new_tokens, batch, choose)


@contextlib.contextmanager
def module_steps(model: Decoder, batch: int, use_cache: bool, compile: bool) -> Iterator[ModuleTextSteps]:
    """A decoder's steps for `batch` rows: through its KV cache (none: the reference loop), or with `compile` through
    a compiled step sharing a static cache (released when the decoding ends)."""
    check_values({"compile": compile, "use_cache": use_cache})
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    if compile:
        with compiled_decoder(model, batch, device, dtype) as decoder:
            yield ModuleTextSteps(model, decoder.cache, decoder.step)
        return
    yield ModuleTextSteps(model, model.new_cache(batch, device, dtype) if use_cache else None)


def decode_text(
    steps: TextSteps, prompt: list[int], max_new_tokens: int, batch: int, choose: ChooseNext
) -> Iterator[torch.Tensor]:
    """The decoding loop of every runtime: yield the next ids (B,) step by step, every row continuing the prompt.
    First chunks (and windows that jumped) are encoded afresh, single new positions fed one at a time; the ids are
    kept in a (B, L) buffer doubled whenever full, so a huge max_new_tokens takes the memory of what is decoded."""
    n, window = len(prompt), steps.window
    tokens = torch.empty(batch, n + min(max_new_tokens, 4096), dtype=torch.long, device=steps.device)  # (B, L)
    tokens[:, :n] = torch.tensor(prompt, dtype=torch.long, device=steps.device)
    for _ in range(max_new_tokens):
        if steps.empty or window.jumps(n):  # a first chunk, a jump, or the reference loop's every step
            first = window.advance(n)
            logits = steps.prefill(tokens[:, first:n], window.position(first))
        else:
            logits = steps.extend(tokens[:, n - 1 : n])
        next_ids = choose(logits[:, -1])  # (B,)
        if n == tokens.size(1):
            tokens = torch.cat([tokens, torch.empty_like(tokens)], dim=1)
        tokens[:, n] = next_ids
        n += 1
        yield next_ids


def teacher_forced(model: Decoder, ids: torch.Tensor, compile: bool = False) -> tuple[list[int], float]:
    """Decode the text `ids` (N,) one character at a time through the cached loop, always feeding the text's own next
    character: the model's first choice at each of the N - 1 steps, and its mean loss (nats) over them. Two
    versions of a model (float32 and int8 weights) compared this way meet the same contexts at every step."""
    firsts: list[int] = []
    total = torch.zeros((), dtype=torch.float64)

    def teacher(logits: torch.Tensor) -> torch.Tensor:  # logits (1, V)
        nonlocal total
        target = ids[len(firsts) + 1 : len(firsts) + 2]  # (1,)
        firsts.append(int(logits[0].argmax()))
        total -= torch.log_softmax(logits[0].double(), dim=-1)[target[0]]
        return target

    for _ in generate_ids(model, [int(ids[0])], len(ids) - 1, 1, teacher, compile=compile):
        pass
    return firsts, float(total) / max(1, len(ids) - 1)


@dataclass
class SampleResult:
    samples: list[str]  # each starts with the prompt
    generated_chars: int  # tokens generated (characters, or bytes), over all samples, up to their stop strings
    seconds: float  # generation time (model loading and compiling excluded)
    replaced: int = 0  # byte models: characters shown as U+FFFD because the bytes were not valid UTF-8
    compile_seconds: float = 0.0  # DecodeOptions.compile: seconds compiling the step took (0: it was compiled before)

    @property
    def chars_per_s(self) -> float:
        return self.generated_chars / self.seconds if self.seconds > 0 else 0.0


def encode_prompt(tokenizer: Tokenizer, prompt: str, unknown: UnknownPolicy, replacement: str | None) -> list[int]:
    if not prompt:
        raise UsageError("the prompt is empty; give at least one character (the default prompt is a newline)")
    ids = tokenizer.encode(prompt, unknown, replacement)
    if not ids:
        raise UsageError("no prompt character is in the model's vocabulary, so nothing is left to start from")
    return ids


@contextlib.contextmanager
def sampling_steps(model: Decoder, options: DecodeOptions) -> Iterator[ModuleTextSteps]:
    """A torch decoder's steps for options.num_samples rows, under inference mode: its KV cache, none
    (options.use_cache off: the reference loop), or with options.compile a compiled step, warmed up first (the
    seconds that took in the steps' compile_seconds)."""
    model.eval()
    compile_seconds = 0.0
    check_values({"compile": options.compile, "use_cache": options.use_cache})
    if options.compile:
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        with compiled_decoder(model, options.num_samples, device, dtype) as compiled:
            compile_seconds = compiled.warm_up()
    with torch.inference_mode(), module_steps(model, options.num_samples, options.use_cache, options.compile) as steps:
        steps.compile_seconds = compile_seconds
        yield steps


def sample(
    model: Decoder,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None = None,
) -> SampleResult:
    """charlm.Model.sample for a bare torch decoder (tests, benchmarks, a model card's sample): num_samples
    continuations in one batch; on_text streams sample 0's new characters."""
    with sampling_steps(model, options) as steps:
        return draw_samples(steps, tokenizer, prompt_ids, options, on_text)


def draw_samples(
    steps: TextSteps,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None = None,
) -> SampleResult:
    """The samples the decoding loop draws through `steps` (a torch module's or an export's graphs), as
    charlm.Model.sample draws them: the seeded chooser, the loop, then stop strings and streaming."""
    texts, choose = SampleTexts(tokenizer, prompt_ids, options, on_text), seeded_chooser(options)
    for next_ids in decode_text(steps, prompt_ids, options.max_new_tokens, options.num_samples, choose):
        if texts.feed(next_ids):
            break
    return texts.result(steps.compile_seconds)


def seeded_chooser(options: DecodeOptions) -> ChooseNext:
    """The next ids under these options, drawn from a generator seeded with options.seed (a fresh seed without one)."""
    generator = seeded_generator(options.seed)

    def choose(logits: torch.Tensor) -> torch.Tensor:
        return sample_next(logits, generator, options.temperature, options.top_k, options.top_p)

    return choose


class SampleTexts:
    """The texts a decoding loop's ids (B,) make as they come, step by step: stop strings, whole characters of a
    byte model, sample 0 streamed to on_text; timed from its making, just before the loop's first step. Every
    runtime's samples end here (torch's, onnxruntime's)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: list[int],
        options: DecodeOptions,
        on_text: Callable[[str], None] | None = None,
    ):
        self.tokenizer, self.prompt_ids, self.on_text = tokenizer, prompt_ids, on_text
        rows = range(options.num_samples)
        self.texts: list[list[str]] = [[] for _ in rows]
        self.ids: list[list[int]] = [[] for _ in rows]
        self.decoders = [tokenizer.stream_decoder() for _ in rows]  # bytes: whole characters only
        self.stops = [StopStrings(options.stop) for _ in rows]
        self.done = [False for _ in rows]
        self.started = time.perf_counter()

    def feed(self, next_ids: torch.Tensor) -> bool:
        """Each row's next id (B,); True once every row has met a stop string (the loop can end)."""
        for i, token in enumerate(next_ids.tolist()):
            if self.done[i]:
                continue
            self.ids[i].append(token)
            self._add(i, self.stops[i].feed(self.decoders[i].feed(token)))
            self.done[i] = self.stops[i].stopped
        return all(self.done)

    def result(self, compile_seconds: float = 0.0) -> SampleResult:
        """The samples, each the prompt and its text up to its stop string (what a stop string held back, and a
        byte model's unfinished character, flushed)."""
        for i, decoder in enumerate(self.decoders):
            if not self.done[i]:
                self._add(i, self.stops[i].finish(decoder.flush()))
        seconds = time.perf_counter() - self.started
        replaced = sum(self.tokenizer.replaced(self.prompt_ids + sample_ids) for sample_ids in self.ids)
        prompt = self.tokenizer.decode(self.prompt_ids)
        samples = [prompt + "".join(t) for t in self.texts]
        return SampleResult(samples, sum(len(t) for t in self.ids), seconds, replaced, compile_seconds)

    def _add(self, i: int, passed: str) -> None:
        if passed:
            self.texts[i].append(passed)
            if i == 0 and self.on_text:
                self.on_text(passed)
