"""A compiled decoding step (`charlm sample --compile`): one character per step with shapes that never change, so
torch.compile fuses a step's ~200 small operations into a few kernels once and reuses them for every position.

At batch 1 a decoding step is hundreds of tiny operations (norms, attention over one query, activations, casts),
each costing more in dispatch than in arithmetic: with int8 weights at 6 x 384 they take about half of the step
(docs/benchmarks.md). Compiled, the step runs ~2x faster after a compilation of seconds, so it pays for long texts
and interactive sessions, not for a 100-character sample; it is opt-in. The first chunk (the prompt) is encoded
eagerly, exactly as without --compile; the compiled steps attend to every slot of a StaticCache through a mask,
which rounds differently from attending to the filled slots only, so a seed's text can differ after a while (as
with int8: scripts/bench_sample.py measures next-character agreement).
"""

from __future__ import annotations

import time
import types
from typing import TYPE_CHECKING, Any, cast

import torch

from charlm.errors import UsageError
from charlm.kvcache import StaticCache

if TYPE_CHECKING:
    from charlm.model import GPT


class CompiledDecoder:
    """A model's decoding steps for one batch size: a StaticCache and the compiled step that fills it."""

    def __init__(self, model: GPT, batch: int, device: torch.device, dtype: torch.dtype):
        c = model.config
        self.model = model
        self.cache = StaticCache(c.n_layer, batch, c.n_head, c.block_size, c.n_embd // c.n_head, device, dtype)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)  # fixed input: same strides every step
        # torch.compile keeps at most torch._dynamo.config.recompile_limit (8) versions per code object, one per
        # model shape (weights are inputs, so same-shaped models share one): a copy of _step's code per decoder gives
        # every model its own, so a notebook that samples from models of many shapes keeps them all compiled rather
        # than running the ninth uncompiled behind a logged warning (measured). A copy costs a trace (~0.2 s when
        # torch's caches hold the kernels).
        step = types.FunctionType(CompiledDecoder._step.__code__.replace(), globals(), "_step")
        self.compiled: Any = torch.compile(types.MethodType(step, self), dynamic=False)
        self.ready = False  # whether the compiled step has run once (compiling happens then)

    def _step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """What is compiled: claim the position's slot, then every layer. ids (B, 1), pos (1,) -> logits (B, 1, V)."""
        self.cache.claim(pos)
        return self.model.logits_at(ids, pos, self.cache)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, V) of the next position, after the cache's first chunk was encoded by model(..., cache)."""
        position = self.cache.length
        if not self.model.relative_positions and position + 1 > self.model.config.block_size:
            raise ValueError(f"position {position} is beyond the model's block_size {self.model.config.block_size}")
        self.cache.prefill = False
        self.ids.copy_(ids)
        pos = torch.full((1,), position, dtype=torch.long, device=self.ids.device)
        if self.ready:
            logits = self.compiled(self.ids, pos)
        else:
            logits = self._first_step(pos)
        self.cache.length = position + 1
        return cast(torch.Tensor, logits)

    @torch.inference_mode()  # as generate_ids runs: a step compiled under another grad mode would compile again
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

    def _first_step(self, pos: torch.Tensor) -> torch.Tensor:
        """The first compiled call compiles; a platform that cannot (no C++ compiler for the CPU backend, say) is
        told in one line, before any slot was written (the step runs only once it compiled)."""
        try:
            logits = self.compiled(self.ids, pos)
        except Exception as error:  # torch raises many types here (BackendCompilerFailed, InductorError, OSError...)
            first_line = (str(error).strip().splitlines() or [""])[0][:200]
            raise UsageError(
                f"--compile: torch.compile could not build the decoding step ({type(error).__name__}: {first_line}); "
                "leave out --compile (on the CPU it needs a C++ compiler such as g++)"
            ) from None
        self.ready = True
        return cast(torch.Tensor, logits)


def compiled_decoder(model: GPT, batch: int, device: torch.device, dtype: torch.dtype) -> CompiledDecoder:
    """The model's decoder for this batch size, made (and later compiled) once per model and kept on it, its cache
    emptied: an interactive session or a server compiles once, not once per text."""
    decoders: dict[tuple[int, torch.device, torch.dtype], CompiledDecoder] = model.__dict__.setdefault(
        "_compiled_decoders", {}
    )
    key = (batch, device, dtype)
    if key not in decoders:
        decoders[key] = CompiledDecoder(model, batch, device, dtype)
    decoder = decoders[key]
    decoder.cache.reset()
    return decoder
