"""Text generation: a KV-cached decoding loop (and a plain reference loop), stop strings, streaming.

Windowing policy. Every position sees at most block_size characters: itself and those before it.
- Absolute positions (learned, sinusoidal): when the text no longer fits, the window jumps forward to keep only the
  last block_size // 2 characters, which are re-encoded once; the next block_size // 2 characters are then decoded
  from the cache. A prompt longer than the context is treated the same way.
- Relative positions (RoPE, ALiBi): the window rolls forward one character per step; the cache drops its oldest
  position and nothing is re-encoded. Each position keeps the keys and values it had when it was decoded, so the
  model acts as a sliding-window Transformer over the whole text.
Both loops follow the same policy, so under greedy decoding they produce the same text.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from charlm.config.schema import ModelConfig
from charlm.data.tokenizer import Tokenizer, UnknownPolicy
from charlm.decoding.compiled import compiled_decoder
from charlm.decoding.options import DecodeOptions, check_values
from charlm.decoding.sampling import sample_next, seeded_generator
from charlm.decoding.steps import GraphStep, GraphTextSteps, ModuleTextSteps, TextSteps
from charlm.decoding.stops import StopStrings
from charlm.errors import UsageError
from charlm.models.decoder import Decoder, decoder_reach, relative_positions

ChooseNext = Callable[[torch.Tensor], torch.Tensor]  # logits (B, V) -> ids (B,)


def window_start(length: int, start: int, block_size: int) -> int:
    """Where the model's window begins once the text is `length` long (it began at `start`)."""
    if length - start > block_size:
        return length - max(1, block_size // 2)
    return start


class ContextWindow:
    """The windowing policy above for one text: where the model's window begins as the text grows. Used by the
    decoding loops here and by the server's engine, row by row."""

    def __init__(self, model: Decoder | ModelConfig):
        """The policy of a model, or of a decoder's config where no torch module runs it (an ONNX export)."""
        config = model if isinstance(model, ModelConfig) else model.config
        self.relative, self.reach = relative_positions(config), decoder_reach(config)
        self.block_size = config.block_size
        self.start = 0

    def advance(self, length: int) -> int:
        """The window's start once the text is `length` long; encode from there to see all the model can."""
        if self.relative:  # rolls: the last `reach` positions are all the next one depends on
            self.start = max(0, length - self.reach)
        else:
            self.start = window_start(length, self.start, self.block_size)
        return self.start

    def jumps(self, length: int) -> bool:
        """Absolute positions: whether the window must jump forward (and be re-encoded) at this length."""
        return not self.relative and window_start(length, self.start, self.block_size) != self.start

    def position(self, start: int) -> int:
        """The position the model gives the window's first character: its place in the text, or 0 for absolute
        positions, which restart with each window."""
        return start if self.relative else 0


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
        yield from decode_text(steps, ContextWindow(model), prompt, max_new_tokens, batch, choose, steps.device)


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
    steps: TextSteps,
    window: ContextWindow,
    prompt: list[int],
    max_new_tokens: int,
    batch: int,
    choose: ChooseNext,
    device: torch.device | None = None,
) -> Iterator[torch.Tensor]:
    """The decoding loop of every runtime: yield the next ids (B,) step by step, every row continuing the prompt.
    First chunks (and windows that jumped) are encoded afresh, single new positions fed one at a time; the ids are
    kept in a (B, L) buffer doubled whenever full, so a huge max_new_tokens takes the memory of what is decoded."""
    n = len(prompt)
    tokens = torch.empty(batch, n + min(max_new_tokens, 4096), dtype=torch.long, device=device)  # (B, L)
    tokens[:, :n] = torch.tensor(prompt, dtype=torch.long, device=device)
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


def sample(
    model: Decoder,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None = None,
) -> SampleResult:
    """Generate num_samples continuations in one batch; on_text streams sample 0's new characters."""
    model.eval()
    compile_seconds = 0.0
    check_values({"compile": options.compile, "use_cache": options.use_cache})
    if options.compile:
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        with compiled_decoder(model, options.num_samples, device, dtype) as compiled:
            compile_seconds = compiled.warm_up()
    with torch.inference_mode(), module_steps(model, options.num_samples, options.use_cache, options.compile) as steps:
        result = samples_of(steps, ContextWindow(model), tokenizer, prompt_ids, options, on_text, steps.device)
    result.compile_seconds = compile_seconds
    return result


def sample_graph(
    step: GraphStep,
    config: ModelConfig,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None = None,
) -> SampleResult:
    """sample() through an export's decoder step (onnxruntime): the same loop, window, sampler and stop strings."""
    return samples_of(GraphTextSteps(step), ContextWindow(config), tokenizer, prompt_ids, options, on_text)


def samples_of(
    steps: TextSteps,
    window: ContextWindow,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None,
    device: torch.device | None = None,
) -> SampleResult:
    """The samples a decoding loop through `steps` draws, whatever runs them: the seeded chooser, the loop, then stop
    strings and streaming (collect_samples), timed from the first step."""
    choose, started = seeded_chooser(options), time.perf_counter()
    ids = decode_text(steps, window, prompt_ids, options.max_new_tokens, options.num_samples, choose, device)
    return collect_samples(ids, tokenizer, prompt_ids, options, on_text, started)


def seeded_chooser(options: DecodeOptions) -> ChooseNext:
    """The next ids under these options, drawn from a generator seeded with options.seed (a fresh seed without one)."""
    generator = seeded_generator(options.seed)

    def choose(logits: torch.Tensor) -> torch.Tensor:
        return sample_next(logits, generator, options.temperature, options.top_k, options.top_p)

    return choose


def collect_samples(
    drawn: Iterator[torch.Tensor],
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    options: DecodeOptions,
    on_text: Callable[[str], None] | None,
    started: float,
) -> SampleResult:
    """The samples of a decoding loop's ids (B,) step by step: stop strings, whole characters of a byte model,
    sample 0 streamed to on_text; timed from `started`. Every runtime's samples end here (torch's, onnxruntime's)."""
    prompt = tokenizer.decode(prompt_ids)
    texts: list[list[str]] = [[] for _ in range(options.num_samples)]
    ids: list[list[int]] = [[] for _ in range(options.num_samples)]
    decoders = [tokenizer.stream_decoder() for _ in range(options.num_samples)]  # bytes: whole characters only
    done = [False] * options.num_samples
    stops = [StopStrings(options.stop) for _ in range(options.num_samples)]
    for next_ids in drawn:
        for i, token in enumerate(next_ids.tolist()):
            if done[i]:
                continue
            ids[i].append(token)
            passed = stops[i].feed(decoders[i].feed(token))
            if passed:
                texts[i].append(passed)
                if i == 0 and on_text:
                    on_text(passed)
            done[i] = stops[i].stopped
        if all(done):
            break
    for i, decoder in enumerate(decoders):
        if not done[i]:
            passed = stops[i].finish(decoder.flush())
            if passed:
                texts[i].append(passed)
                if i == 0 and on_text:
                    on_text(passed)
    seconds = time.perf_counter() - started
    replaced = sum(tokenizer.replaced(prompt_ids + sample_ids) for sample_ids in ids)
    samples = [prompt + "".join(t) for t in texts]
    return SampleResult(samples, sum(len(t) for t in ids), seconds, replaced)
