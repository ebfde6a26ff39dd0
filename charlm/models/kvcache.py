"""Keys and values kept between decoding steps: one text at a time (KVCache), many texts at their own positions
decoded together (RowCache, for `charlm serve`), or one text in fixed shapes for a compiled step (StaticCache); each
kind answers the model through one interface (Cache), so the model never asks which kind it holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import torch

LengthCheck = Callable[[int], None]  # the model's refusal of a text of that many positions (Transformer.check_length)


class Cache(Protocol):
    """What a model asks of a cache, whatever its kind: the positions of a forward's new tokens, each layer's keys
    and values, and token shift's memory. The model calls these without asking which kind it holds."""

    def begin(self, length: int, start: int, check: LengthCheck) -> torch.Tensor:
        """Once per forward, before the layers: the new tokens' positions, (T,) or (B, 1), their slots claimed."""
        ...

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store a layer's new keys and values (B, nh, T, hd); the keys, values and key positions to attend to."""
        ...

    def predecessors(self, x: torch.Tensor, point: int) -> torch.Tensor:
        """Token shift at shift point `point`: each position's predecessor in x (B, T, C), across steps."""
        ...


class KVCache:
    """Keys and values of every layer for incremental decoding, one slot per position of the context.

    Position p lives in slot p % max_len, so once the cache is full each new position overwrites the oldest one:
    with relative positions (RoPE, ALiBi) the window rolls forward without re-encoding anything.
    """

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = torch.zeros(max_len, dtype=torch.long, device=device)  # the position held in each slot
        self.last = token_shift_state(n_layer, batch, n_head * head_dim, device, dtype)
        self.max_len = max_len
        self.length = 0  # the next position (0: empty)
        self.prefill = True  # whether this step is a text's (or window's) first chunk: set by begin()

    def reset(self) -> None:
        self.length = 0

    def predecessors(self, x: torch.Tensor, point: int) -> torch.Tensor:
        """model.token_shift at shift point `point` (0: the embeddings, 1 + l: layer l's attention input): each
        position's predecessor in x (B, T, C), for the first the last one encoded before (none for a text's first
        chunk); keeps x's last position for the next step."""
        return shifted(x, self.last[point], self.prefill)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the rows in `index` (B',), in that order: a beam search's surviving beams."""
        self.k, self.v = self.k.index_select(1, index), self.v.index_select(1, index)
        self.last = self.last.index_select(1, index)

    def begin(self, length: int, start: int, check: LengthCheck) -> torch.Tensor:
        """Once per forward, before the layers: the positions (T,) of `length` new tokens, which continue the text
        held (or start at `start` in an empty cache), their slots claimed. `check` is the model's refusal of a text
        longer than its positions allow."""
        first = self.length or start
        check(first + length)
        if self.length and length != 1:
            raise ValueError("a non-empty KV cache takes one new position at a time")
        pos = torch.arange(first, first + length, device=self.pos.device)  # (T,)
        self.prefill = self.length == 0
        kept = pos[-self.max_len :]
        self.slots = kept % self.max_len
        self.pos[self.slots] = kept
        self.step_pos = pos
        self.length = first + length
        return pos

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store this step's (B, nh, T, hd) keys/values; return the keys, values and positions to attend to."""
        kept = len(self.slots)
        self.k[layer].index_copy_(2, self.slots, k[:, :, -kept:])
        self.v[layer].index_copy_(2, self.slots, v[:, :, -kept:])
        if self.prefill:  # a first chunk attends to itself (all of it, even beyond max_len)
            return k, v, self.step_pos
        filled = min(self.length, self.max_len)
        return self.k[layer, :, :, :filled], self.v[layer, :, :, :filled], self.pos[:filled]


class RowCache:
    """Keys and values of up to `rows` independent texts, each at its own position: `charlm serve`'s running batch.

    Row r's position p lives in slot p % max_len of row r, as in KVCache. A row is filled by copying a KVCache that
    encoded one text (load_row); then every step takes one new character for each of the first `active` rows, so
    texts of any lengths are decoded in one forward pass. Slots a row has not written hold EMPTY, a position so far
    back that attention masks it out.
    """

    EMPTY = -(2**40)

    def __init__(
        self,
        n_layer: int,
        rows: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        shape = (n_layer, rows, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = torch.full((rows, max_len), self.EMPTY, dtype=torch.long, device=device)  # (R, L)
        self.next_pos = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) each row's next position
        self.last = token_shift_state(n_layer, rows, n_head * head_dim, device, dtype)
        self.max_len = max_len
        self.active = 0  # rows 0..active-1 take part in each step

    def load_row(self, row: int, cache: KVCache | None) -> None:
        """Row `row` takes over what `cache` (batch 1) encoded; None empties it (its next position is 0)."""
        self.pos[row] = self.EMPTY
        if cache is None or cache.length == 0:
            self.next_pos[row] = 0
            self.last[:, row] = 0  # a text's first character has no predecessor
            return
        filled = min(cache.length, cache.max_len)
        self.k[:, row], self.v[:, row] = cache.k[:, 0], cache.v[:, 0]
        self.pos[row, :filled] = cache.pos[:filled]
        self.next_pos[row], self.last[:, row] = cache.length, cache.last[:, 0]

    def move_row(self, source: int, target: int) -> None:
        """Copy row `source` into row `target` (keeping the running rows packed at the front)."""
        self.k[:, target], self.v[:, target] = self.k[:, source], self.v[:, source]
        self.pos[target], self.next_pos[target] = self.pos[source], self.next_pos[source]
        self.last[:, target] = self.last[:, source]

    def begin(self, length: int, start: int, check: LengthCheck) -> torch.Tensor:
        """Once per forward, before the layers: each active row's next position (B, 1), its slot claimed. Neither
        `start` nor `check` applies: each row continues its own text, whose window its owner keeps (charlm.serving)."""
        if length != 1:
            raise ValueError("a RowCache takes one new position per row at a time; encode prompts with a KVCache")
        n = self.active
        pos = self.next_pos[:n].clone()  # (B,)
        self.rows = torch.arange(n, device=pos.device)
        self.slots = pos % self.max_len
        self.pos[self.rows, self.slots] = pos
        self.next_pos[:n] += 1
        return pos[:, None]  # (B, 1)

    def predecessors(self, x: torch.Tensor, point: int) -> torch.Tensor:
        """As KVCache.predecessors, for this step's one position per active row (B, 1, C)."""
        return shifted(x, self.last[point, : self.active], False)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store this step's (B, nh, 1, hd) keys/values; return every slot's keys, values and positions (B, S)."""
        n = self.active
        self.k[layer, self.rows, :, self.slots] = k[:, :, 0]  # (B, nh, hd) into each row's own slot
        self.v[layer, self.rows, :, self.slots] = v[:, :, 0]
        return self.k[layer, :n], self.v[layer, :n], self.pos[:n]


class StaticCache:
    """KVCache's slots (position p in slot p % max_len) with shapes that never change, for a compiled decoding step.

    A first chunk is encoded as KVCache encodes it (the same arithmetic). After that each step attends to every slot
    through a mask instead of to the filled ones, so every step has the same shapes and torch.compile traces it once;
    slots not yet written hold RowCache.EMPTY, a position so far back that the mask hides it. Each layer's keys and
    values are a tensor of their own, so a compiled step writes its slot in place rather than copying the cache.
    """

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        shape = (batch, n_head, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.pos = torch.full((max_len,), RowCache.EMPTY, dtype=torch.long, device=device)  # each slot's position
        self.last = token_shift_state(n_layer, batch, n_head * head_dim, device, dtype)
        self.max_len = max_len
        self.length = 0  # the next position (0: empty)
        self.prefill = False

    def reset(self) -> None:
        self.length = 0
        self.pos.fill_(RowCache.EMPTY)

    def begin(self, length: int, start: int, check: LengthCheck) -> torch.Tensor:
        """A first chunk's positions (T,) from `start`, before the layers (an eager forward pass, as KVCache.begin)."""
        if self.length:
            raise ValueError("a non-empty static cache takes its steps through CompiledDecoder.step")
        check(start + length)
        pos = torch.arange(start, start + length, device=self.pos.device)  # (T,)
        self.prefill = True
        self.claim(pos[-self.max_len :])
        self.step_pos = pos
        self.length = start + length
        return pos

    def predecessors(self, x: torch.Tensor, point: int) -> torch.Tensor:
        """As KVCache.predecessors (in place inside the compiled step)."""
        return shifted(x, self.last[point], self.prefill)

    def claim(self, pos: torch.Tensor) -> None:
        """Write this step's positions (T,) into their slots (inside the compiled step for single positions)."""
        self.slots = pos % self.max_len
        self.pos[self.slots] = pos

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store this step's (B, nh, T, hd) keys/values; return the keys, values and positions to attend to: a first
        chunk's own, or every slot's with positions (1, S), which always takes attention's masked path."""
        kept = len(self.slots)
        self.k[layer][:, :, self.slots] = k[:, :, -kept:]
        self.v[layer][:, :, self.slots] = v[:, :, -kept:]
        if self.prefill:  # a first chunk attends to itself (all of it, even beyond max_len)
            return k, v, self.step_pos
        return self.k[layer], self.v[layer], self.pos[None]


def token_shift_state(n_layer: int, batch: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """model.token_shift's memory between steps (n_layer + 1, B, C): the last position's input at each shift point."""
    return torch.zeros(n_layer + 1, batch, dim, device=device, dtype=dtype)


def shifted(x: torch.Tensor, last: torch.Tensor, fresh: bool) -> torch.Tensor:
    """x (B, T, C) moved one position on, `last` (B, C) before its first position (zeros when `fresh`: the start of
    a text or of a re-encoded window, as in training); `last` then holds x's last position."""
    if x.size(1) == 1 and not fresh:  # a decoding step (the common case: as few operations as can be)
        previous = last.unsqueeze(1).to(x.dtype, copy=True)  # (B, 1, C), copied before `last` is overwritten
    else:
        first = torch.zeros_like(x[:, :1]) if fresh else last[:, None].to(x.dtype)
        previous = torch.cat([first, x[:, :-1]], dim=1)  # (B, T, C)
    last.copy_(x[:, -1].detach())
    return previous


CacheT = TypeVar("CacheT", KVCache, RowCache, StaticCache)  # a kind of cache asked for by its class
