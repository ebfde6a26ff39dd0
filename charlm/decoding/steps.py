"""What the decoding loops run a model through, one position at a time: torch modules with their KV caches, and an
ONNX export's graphs (a step that hands its state back as arrays). Each loop is written once, over these.

Text (a decoder): `prefill(ids (B, T), start)` encodes a window afresh from position `start`; `extend(ids (B, 1))`
feeds one new position after what was fed; `empty` says nothing is kept yet (or the loop must always re-encode).
Targets (an encoder–decoder): `logits(token (R, 1))` feeds every row one target position and gives each row's next
logits (R, V), padding and the start symbol never chosen; `keep_rows(index)` continues from those rows (beam search).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from charlm.config.schema import ModelConfig
from charlm.data.pairs import pad_batch
from charlm.data.tokenizer import BOS, PAD
from charlm.decoding.window import ContextWindow
from charlm.models.decoder import Decoder
from charlm.models.encoder_decoder import EncoderDecoder
from charlm.models.kvcache import KVCache, StaticCache

State = Any  # whatever a runtime keeps between steps (onnxruntime's output arrays)
GraphStep = Callable[[torch.Tensor, int, State], tuple[torch.Tensor, State]]  # (ids, start, state) -> logits, state
Models = EncoderDecoder | Sequence[EncoderDecoder]  # one model, or an ensemble's members


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


# ---------------------------------------------------------------------------- text


class TextSteps(Protocol):
    window: ContextWindow  # where the model's window begins as the text grows
    device: torch.device | None  # where the ids go (None: onnxruntime's arrays, made on the CPU)
    compile_seconds: float  # what compiling the step took before the first (0: nothing compiled)

    @property
    def empty(self) -> bool: ...

    def prefill(self, ids: torch.Tensor, start: int) -> torch.Tensor: ...

    def extend(self, ids: torch.Tensor) -> torch.Tensor: ...


class ModuleTextSteps:
    """A decoder module and its cache (None: the reference loop, the whole window every step); single new positions
    go through `extend_one` (the module itself, or a compiled step sharing the cache)."""

    def __init__(
        self,
        model: Decoder,
        cache: KVCache | StaticCache | None,
        extend_one: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.model, self.cache = model, cache
        self.extend_one = extend_one or (lambda ids: model(ids, cache=cache)[0])
        self.window, self.compile_seconds = ContextWindow(model), 0.0
        self.device: torch.device | None = next(model.parameters()).device

    @property
    def empty(self) -> bool:
        return self.cache is None or self.cache.length == 0

    def prefill(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        if self.cache is not None:
            self.cache.reset()
        return self.model(ids, cache=self.cache, start_pos=start)[0]

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        return self.extend_one(ids)  # relative positions: the cache's oldest position rolls out


class GraphTextSteps:
    """An export's decoder step, its state kept here between calls (None: nothing fed yet)."""

    def __init__(self, step: GraphStep, config: ModelConfig):
        self.step, self.state, self.length = step, None, 0  # length: the position the next new id takes
        self.window, self.compile_seconds = ContextWindow(config), 0.0
        self.device: torch.device | None = None  # onnxruntime's arrays are made on the CPU

    @property
    def empty(self) -> bool:
        return self.state is None

    def prefill(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        logits, self.state = self.step(ids, start, None)
        self.length = start + ids.size(1)
        return logits

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        logits, self.state = self.step(ids, self.length, self.state)
        self.length += 1
        return logits


# ---------------------------------------------------------------------------- targets


class TargetSteps(Protocol):
    device: torch.device

    def logits(self, token: torch.Tensor) -> torch.Tensor: ...

    def keep_rows(self, index: torch.Tensor) -> None: ...


def members(model: Models) -> list[EncoderDecoder]:
    """The models that decode: the one given, or an ensemble's members."""
    return list(model) if isinstance(model, Sequence) else [model]


def never_inside(logits: torch.Tensor) -> torch.Tensor:
    """logits (R, V) as floats, with padding and the start symbol never written inside a target."""
    logits = logits.float()
    logits[:, [PAD, BOS]] = -math.inf
    return logits


class ModuleTargetSteps:
    """The target side through torch modules: the sources encoded once by each model (each repeated `copies` times,
    one row per beam) and a KV cache per model; an ensemble's logits are its members' mean log-probabilities."""

    def __init__(self, model: Models, sources: list[list[int]], copies: int = 1):
        self.models = members(model)
        self.device = next(self.models[0].parameters()).device
        (src, _), _ = pad_batch([(s, []) for s in sources], self.device)
        self.memory, self.key_mask, self.caches = [], [], []
        for m in self.models:
            encoded, key_mask = m.encode(src)  # once per source
            if copies > 1:
                encoded, key_mask = encoded.repeat_interleave(copies, dim=0), key_mask.repeat_interleave(copies, dim=0)
            self.memory.append(m.memory(encoded))
            self.key_mask.append(key_mask)
            self.caches.append(m.new_cache(len(sources) * copies, self.device))

    def logits(self, token: torch.Tensor) -> torch.Tensor:
        each = []
        for m, memory, key_mask, cache in zip(self.models, self.memory, self.key_mask, self.caches, strict=True):
            each.append(never_inside(m.decode(token, memory, key_mask, cache)[:, -1]))  # (R, V)
        if len(each) == 1:
            return each[0]
        return torch.stack([torch.log_softmax(logits, dim=-1) for logits in each]).mean(0)  # (R, V)

    def keep_rows(self, index: torch.Tensor) -> None:
        for cache in self.caches:
            cache.select_rows(index)


# The rows' axis of each array an export's encoder-decoder graphs pass (charlm/models/onnx_graphs.py): the memory's
# keys and values (L, B, ...) and mask (B, S); the state's keys and values (L, B, ...), slot positions (none: shared)
# and token shift's inputs (L + 1, B, C).
MEMORY_ROWS = (1, 1, 0)
STATE_ROWS = (1, 1, None, 1)


class GraphTargetSteps:
    """The target side through an export's encoder and decoder-step graphs, the state kept here between calls."""

    device = torch.device("cpu")

    def __init__(self, runtime: GraphRuntime, sources: list[list[int]], copies: int = 1):
        (src, _), _ = pad_batch([(s, []) for s in sources], self.device)
        memory = runtime.encode(src)
        if copies > 1:
            memory = [m.repeat(copies, axis=axis) for m, axis in zip(memory, MEMORY_ROWS, strict=True)]
        self.runtime, self.memory, self.position = runtime, memory, 0
        self.state: State = None  # the decoder's own arrays after each step

    def logits(self, token: torch.Tensor) -> torch.Tensor:
        logits, self.state = self.runtime.target_step(token, self.position, self.state, self.memory)
        self.position += 1
        return never_inside(logits[:, -1])

    def keep_rows(self, index: torch.Tensor) -> None:
        rows, axes = index.cpu().numpy(), STATE_ROWS[: len(self.state)]  # no token shift: three arrays
        self.state = [s if axis is None else s.take(rows, axis=axis) for s, axis in zip(self.state, axes, strict=True)]
