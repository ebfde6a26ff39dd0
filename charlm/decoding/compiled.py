"""A compiled decoding step (`charlm sample --compile`): one character per step with shapes that never change, so
torch.compile fuses a step's many small operations into a few kernels once and reuses them for every position.

At batch 1 a decoding step is hundreds of tiny operations (norms, attention over one query, activations, casts),
each costing more in dispatch than in arithmetic: with int8 weights on a big model they are much of the step.
Compiled, a batch-1 step runs faster after seconds of compiling (docs/benchmarks.md), so it pays for long texts and
interactive sessions, not for a 100-character sample; it is opt-in. The first chunk (the prompt) is
encoded eagerly, exactly as without --compile; the compiled steps attend to every slot of a StaticCache through a
mask, which rounds differently from attending to the filled slots only, so a seed's text can differ after a while
(as with int8: scripts/bench_sample.py measures next-character agreement).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch

from charlm.errors import UsageError
from charlm.models.kvcache import StaticCache

if TYPE_CHECKING:
    from charlm.models.decoder import Decoder


class CompiledDecoder:
    """A model's decoding steps for one batch size: a StaticCache and the compiled step that fills it.

    Its tensors are made, and only ever changed, under torch.inference_mode (as generate_ids decodes): tensors made
    there cannot be changed outside it, and a step compiled under one grad mode would compile again under another.
    """

    @torch.inference_mode()
    def __init__(self, model: Decoder, batch: int, device: torch.device, dtype: torch.dtype):
        self.model = model
        self.cache = model.empty_cache(StaticCache, batch, device, dtype)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)  # fixed input: same strides every step
        self.ready = False  # whether the compiled step has run once (compiling happens then)
        self.busy = False  # held by a decoding loop (compiled_decoder)
        compile_: Any = torch.compile  # its typed overloads do not list isolate_recompiles (docs/benchmarks.md)
        options = compile_options(compile_)
        self.compiled: Any = _refusing_in_one_line(lambda: compile_(self._step, dynamic=False, **options))

    def _step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """What is compiled: claim the position's slot, then every layer. ids (B, 1), pos (1,) -> logits (B, 1, V)."""
        self.cache.claim(pos)
        return self.model.logits_at(ids, pos, self.cache)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, V) of the next position, after the cache's first chunk was encoded by model(..., cache)."""
        position = self.cache.length
        self.model.check_length(position + 1)
        self.cache.prefill = False
        self.ids.copy_(ids)
        pos = torch.full((1,), position, dtype=torch.long, device=self.ids.device)
        if self.ready:
            logits = self.compiled(self.ids, pos)
        else:  # the first call compiles; nothing is written before it has (the step runs only once compiled)
            logits = _refusing_in_one_line(lambda: self.compiled(self.ids, pos))
            self.ready = True
        self.cache.length = position + 1
        return cast(torch.Tensor, logits)

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile now (one step at position 0 of an emptied cache), so the time of compiling is not counted as
        decoding; the seconds it took (0 once compiled)."""
        if self.ready:
            return 0.0
        started = time.perf_counter()
        self.cache.reset()
        self.step(torch.zeros_like(self.ids))
        self.cache.reset()
        return time.perf_counter() - started


def compile_options(compile_: Any) -> dict[str, Any]:
    """torch.compile's options for a decoding step. isolate_recompiles: torch.compile keeps at most recompile_limit
    (8) versions of _step per code object, one per model shape; counted per decoder instead, a notebook that samples
    from models of many shapes keeps them all compiled rather than running the ninth uncompiled behind a logged
    warning. A torch older than the option (before 2.13) compiles without it: the charlm versions it supports
    (torch >= 2.6) must not fail on it."""
    return {"isolate_recompiles": True} if "isolate_recompiles" in inspect.signature(compile_).parameters else {}


def _refusing_in_one_line(build: Any) -> Any:
    """build(), or a UsageError in one line when torch cannot compile here (no C++ compiler for the CPU code, no
    Triton for the GPU's, a Python that torch.compile does not support); the cause stays chained for --debug."""
    try:
        return build()
    except Exception as error:  # torch raises many types here (BackendCompilerFailed, InductorError, RuntimeError)
        cause: BaseException = error  # the innermost error names the reason; the wrappers name only the backend
        while (inner := getattr(cause, "inner_exception", None) or cause.__cause__) is not None:
            cause = inner
        first_line = (str(cause).strip().splitlines() or [""])[0][:200]
        raise UsageError(
            f"--compile: torch.compile could not build the decoding step ({type(cause).__name__}: {first_line}); "
            "leave out --compile (it needs a C++ compiler such as g++ on the CPU, Triton on a GPU)"
        ) from error


_claiming = threading.Lock()


@contextlib.contextmanager
def compiled_decoder(model: Decoder, batch: int, device: torch.device, dtype: torch.dtype) -> Iterator[CompiledDecoder]:
    """The model's decoder for this batch size, its cache emptied, held for one decoding loop.

    Made (and compiled) once per model and kept on it, so an interactive session compiles once, not once per text.
    While a loop holds it, another loop on the same model (a second generator, another thread) gets a decoder of
    its own, compiled anew, rather than one whose cache is in use."""
    with _claiming:
        decoders: dict[tuple[int, torch.device, torch.dtype], CompiledDecoder] = model.__dict__.setdefault(
            "_compiled_decoders", {}
        )
        decoder = decoders.get((batch, device, dtype))
        if decoder is None or decoder.busy:
            decoder = CompiledDecoder(model, batch, device, dtype)
            decoders.setdefault((batch, device, dtype), decoder)
        decoder.busy = True
    try:
        with torch.inference_mode():
            decoder.cache.reset()
        yield decoder
    finally:
        decoder.busy = False
