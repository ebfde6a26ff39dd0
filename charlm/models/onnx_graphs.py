"""The three families as graphs for ONNX export: each computation with its decoding state passed in and handed back
as tensors (no Python state, no shape that depends on values), so one traced graph serves every step of every text.

The decoder's state is StaticCache's layout as plain tensors: keys and values (L, B, nh, S, hd) in S = block_size
fixed slots (position p in slot p % S), the position each slot holds (S,) (EMPTY where none: attention's mask hides
it), and token shift's last inputs (L + 1, B, C). A step's new positions attend to every slot and to themselves
through one mask, so a first chunk of any length (a prompt, a re-encoded window) and a single new character take the
same graph; an empty state is a fresh text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from charlm.models.decoder import Decoder
from charlm.models.encoder import Encoder
from charlm.models.encoder_decoder import EncoderDecoder
from charlm.models.kvcache import RowCache

EMPTY = RowCache.EMPTY  # a slot no position has written: so far back that every mask hides it


@dataclass
class Graph:
    """One graph of an export: its file name, the module traced, example inputs, and the names (and dynamic axes,
    by name) of its inputs and outputs."""

    name: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    dynamic: dict[str, dict[int, str]]  # input name -> {axis: "batch" | "time" | "source"}


class TensorCache:
    """The Cache interface over the tensors a step graph is given; what the layers store is collected as new
    tensors (`state()`), never written in place, so the graph returns the next state.

    Slot s takes the newest new position p with p % S == s: the new tensors are a gather from the step's own keys
    and values where such a position exists and the old slot elsewhere (no scatter, and no shape from values)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, slot_pos: torch.Tensor, shift: torch.Tensor | None, pos):
        self.k, self.v, self.slot_pos, self.shift, self.pos = k, v, slot_pos, shift, pos  # pos (T,): the new ones
        S = slot_pos.size(0)
        first, last = pos[0], pos[-1]
        slots = torch.arange(S, device=slot_pos.device)
        self.take = (last - first) - torch.remainder(last - slots, S)  # (S,) index into the new positions, < 0: none
        self.keep = self.take < 0
        self.index = self.take.clamp(min=0)
        self.new_pos = torch.where(self.keep, slot_pos, first + self.take)  # (S,)
        self.new_k: list[torch.Tensor] = []
        self.new_v: list[torch.Tensor] = []
        self.new_shift: dict[int, torch.Tensor] = {}

    def begin(self, length: int, start: int, check: object) -> torch.Tensor:
        """The new tokens' positions (T,), given to the graph: the runtime keeps them within what the model allows."""
        return self.pos

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every slot's keys and values then the new ones (B, nh, S + T, hd), with positions (1, S + T): attention
        takes its masked path (the window, and EMPTY slots hidden)."""
        old_k, old_v = self.k[layer], self.v[layer]
        self.new_k.append(torch.where(self.keep[:, None], old_k, k.index_select(2, self.index)))
        self.new_v.append(torch.where(self.keep[:, None], old_v, v.index_select(2, self.index)))
        k_pos = torch.cat([self.slot_pos, self.pos])[None]
        return torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2), k_pos

    def predecessors(self, x: torch.Tensor, point: int) -> torch.Tensor:
        """Token shift: each new position's predecessor, the first one's from the state (zeros for a fresh text)."""
        assert self.shift is not None  # a model with token shift is given its state
        self.new_shift[point] = x[:, -1]
        return torch.cat([self.shift[point][:, None].to(x.dtype), x[:, :-1]], dim=1)

    def state(self) -> list[torch.Tensor]:
        """The next state: keys, values, slot positions and (with token shift) the last inputs at each point."""
        out = [torch.stack(self.new_k), torch.stack(self.new_v), self.new_pos]
        if self.shift is not None:
            out.append(torch.stack([self.new_shift[p] for p in range(len(self.new_shift))]))
        return out


STATE_IN = ["cache_k", "cache_v", "cache_pos"]
STATE_OUT = ["new_cache_k", "new_cache_v", "new_cache_pos"]


def empty_state(model: Decoder | EncoderDecoder, batch: int, layers: int) -> list[torch.Tensor]:
    """The state of a fresh text: every slot EMPTY, token shift's memory zeros (a text's first character has no
    predecessor)."""
    c = model.config
    shape = (layers, batch, c.n_head, c.block_size, c.n_embd // c.n_head)
    state = [torch.zeros(shape), torch.zeros(shape), torch.full((c.block_size,), EMPTY, dtype=torch.long)]
    if c.token_shift:
        state.append(torch.zeros(layers + 1, batch, c.n_embd))
    return state


def _state_names(model: Decoder | EncoderDecoder) -> tuple[list[str], list[str]]:
    shift = model.config.token_shift
    return STATE_IN + ["shift"] * shift, STATE_OUT + ["new_shift"] * shift


def _state_axes(names: list[str]) -> dict[str, dict[int, str]]:
    return {name: ({1: "batch"} if name != "cache_pos" else {}) for name in names}


class DecoderStep(nn.Module):
    """The decoder's step: new ids (B, T) from position `start` (1,), and the state -> logits (B, T, V) and the
    next state."""

    def __init__(self, model: Decoder):
        super().__init__()
        self.model = model

    def forward(
        self,
        ids: torch.Tensor,
        start: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        cache_pos: torch.Tensor,
        shift: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        pos = start + torch.arange(ids.size(1), device=ids.device)  # (T,)
        cache = TensorCache(cache_k, cache_v, cache_pos, shift, pos)
        logits = self.model(ids, cache=cache)[0]  # TensorCache answers the Cache interface
        return (logits, *cache.state())


def decoder_graphs(model: Decoder) -> list[Graph]:
    state_in, state_out = _state_names(model)
    ids = torch.zeros(2, 3, dtype=torch.long)  # two rows and three positions: torch.export specialises sizes of 1
    inputs = (ids, torch.zeros(1, dtype=torch.long), *empty_state(model, 2, model.config.n_layer))
    dynamic = {"ids": {0: "batch", 1: "time"}, **_state_axes(state_in)}
    names = ["ids", "start", *state_in]
    return [Graph("model", DecoderStep(model), inputs, names, ["logits", *state_out], dynamic)]


class SourceEncoder(nn.Module):
    """An encoder-decoder's encoder: padded sources (B, S) -> each decoder layer's cross-attention keys and values
    (Ld, B, nh, S, hd) and the mask of real characters (B, S)."""

    def __init__(self, model: EncoderDecoder):
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        encoded, key_mask = self.model.encode(src)
        memory = [kv for kv in self.model.memory(encoded) if kv is not None]
        return torch.stack([k for k, _ in memory]), torch.stack([v for _, v in memory]), key_mask


class TargetStep(nn.Module):
    """An encoder-decoder's decoding step: new target ids (B, T) from `start`, the state, and the encoder's memory
    -> logits (B, T, V) and the next state."""

    def __init__(self, model: EncoderDecoder):
        super().__init__()
        self.model = model

    def forward(
        self,
        tgt: torch.Tensor,
        start: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        cache_pos: torch.Tensor,
        memory_k: torch.Tensor,
        memory_v: torch.Tensor,
        src_mask: torch.Tensor,
        shift: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        pos = start + torch.arange(tgt.size(1), device=tgt.device)  # (T,)
        cache = TensorCache(cache_k, cache_v, cache_pos, shift, pos)
        memory: list = [(memory_k[i], memory_v[i]) for i in range(memory_k.size(0))]
        logits = self.model.decode(tgt, memory, src_mask, cache)  # type: ignore[arg-type]
        return (logits, *cache.state())


def encoder_decoder_graphs(model: EncoderDecoder) -> list[Graph]:
    state_in, state_out = _state_names(model)
    src = torch.full((2, 4), 3, dtype=torch.long)  # two rows: torch.export specialises sizes of 1
    memory_k, memory_v, src_mask = SourceEncoder(model)(src)
    memory_axes = {0: "batch", 1: "source"}
    encoder = Graph(
        "encoder",
        SourceEncoder(model),
        (src,),
        ["src"],
        ["memory_k", "memory_v", "src_mask"],
        {"src": memory_axes},
    )
    state = empty_state(model, 2, model.config.n_layer)
    step_inputs = (
        torch.full((2, 3), 3, dtype=torch.long),
        torch.zeros(1, dtype=torch.long),
        *state[:3],
        memory_k.detach(),
        memory_v.detach(),
        src_mask,
        *state[3:],
    )
    dynamic = {
        "tgt": {0: "batch", 1: "time"},
        **_state_axes(state_in),
        "memory_k": {1: "batch", 3: "source"},
        "memory_v": {1: "batch", 3: "source"},
        "src_mask": memory_axes,
    }
    names = ["tgt", "start", *state_in[:3], "memory_k", "memory_v", "src_mask", *state_in[3:]]
    decoder = Graph("decoder", TargetStep(model), step_inputs, names, ["logits", *state_out], dynamic)
    return [encoder, decoder]


class MaskedLM(nn.Module):
    """The encoder: ids (B, T), hidden characters as the mask id -> logits (B, T, V + 1)."""

    def __init__(self, model: Encoder):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids)[0]


def encoder_graphs(model: Encoder) -> list[Graph]:
    ids = torch.zeros(2, min(4, model.config.block_size), dtype=torch.long)
    return [Graph("model", MaskedLM(model), (ids,), ["ids"], ["logits"], {"ids": {0: "batch", 1: "time"}})]
