"""From a text file to tensors of token ids: reading, splitting, random training windows, full passes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from charlm.errors import UsageError
from charlm.tokenizer import CharTokenizer, UnknownPolicy


def read_text(path: str | Path) -> str:
    """Read a file as strict UTF-8; a missing, empty, non-file or non-UTF-8 file is refused with the reason."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"data file not found: {path} (run `charlm download`, or pass --data PATH to a UTF-8 text file)")
    if path.is_dir():
        raise UsageError(f"data path is a directory, not a text file: {path} (pass --data PATH to a file)")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read data file {path}: {e.strerror}") from e
    if not raw:
        raise UsageError(f"data file is empty: {path} (give a UTF-8 text file with some text in it)")
    return decode_utf8(raw, f"data file {path}")


def read_prompt(source: str) -> str:
    """A prompt from a UTF-8 file, or from standard input when the source is `-`."""
    if source == "-":
        raw, what = sys.stdin.buffer.read(), "the prompt on standard input"
    else:
        path = Path(source)
        if not path.is_file():
            problem = "is a directory" if path.is_dir() else "not found"
            raise UsageError(f"prompt file {problem}: {path} (give a UTF-8 text file, or - to read standard input)")
        try:
            raw, what = path.read_bytes(), f"prompt file {path}"
        except OSError as e:
            raise UsageError(f"cannot read prompt file {path}: {e.strerror}") from e
    return decode_utf8(raw, what)


def decode_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{what} is not valid UTF-8: byte 0x{raw[e.start]:02x} at byte offset {e.start} "
            "(convert it, e.g. `iconv -f latin1 -t utf-8`)"
        ) from e


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """First (1 - val_fraction) for training, the rest for validation (nanoGPT's char split)."""
    n = int(len(text) * (1 - val_fraction))
    return text[:n], text[n:]


def encode_compact(ids: list[int], vocab_size: int) -> torch.Tensor:
    """Token ids in the smallest integer dtype that holds the vocabulary (1 byte per char for most texts)."""
    dtype = torch.uint8 if vocab_size <= 256 else torch.int16 if vocab_size <= 32767 else torch.int32
    return torch.tensor(ids, dtype=dtype)


@dataclass
class Corpus:
    """A text encoded once and split into train and validation ids."""

    tokenizer: CharTokenizer
    train: torch.Tensor  # (N_train,) compact ids
    val: torch.Tensor  # (N_val,) compact ids

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        val_fraction: float,
        tokenizer: CharTokenizer | None = None,
        unknown: UnknownPolicy = "error",
    ) -> Corpus:
        text = read_text(path)
        tokenizer = tokenizer or CharTokenizer.from_text(text)
        train_text, val_text = split_text(text, val_fraction)
        ids = [encode_compact(tokenizer.encode(part, unknown), tokenizer.vocab_size) for part in (train_text, val_text)]
        return cls(tokenizer, ids[0], ids[1])

    def check_windows(self, block_size: int, source: str) -> None:
        """Both splits must hold at least one whole window (block_size inputs plus the next character)."""
        need = block_size + 1
        for name, ids in (("training", self.train), ("validation", self.val)):
            if len(ids) < need:
                raise UsageError(
                    f"data file {source} is too short: its {name} split has {len(ids)} characters but a window "
                    f"needs {need} (model.block_size + 1); use a longer text, a smaller model.block_size"
                    + (" or a larger data.val_fraction" if name == "validation" else "")
                )


class BatchSampler:
    """Random training windows drawn with a seeded generator: x, and y = x shifted by one."""

    def __init__(self, ids: torch.Tensor, block_size: int, batch_size: int, device: torch.device, seed: int):
        self.ids = ids
        self.block_size = block_size
        self.batch_size = batch_size
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(block_size + 1)  # (T+1,)
        self.pin = device.type == "cuda"

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.ids) - self.block_size, (self.batch_size,), generator=self.generator)
        return windows_at(self.ids, starts, self.offsets, self.device, self.pin)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def windows_at(
    ids: torch.Tensor, starts: torch.Tensor, offsets: torch.Tensor, device: torch.device, pin: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the windows beginning at `starts` in one indexing op (no loop per row)."""
    chunk = ids[starts[:, None] + offsets].long()  # (B, T+1)
    if pin:
        chunk = chunk.pin_memory()
    chunk = chunk.to(device, non_blocking=pin)
    return chunk[:, :-1], chunk[:, 1:]  # (B, T), (B, T)


def fixed_windows(ids: torch.Tensor, block_size: int, count: int, seed: int) -> torch.Tensor:
    """Start offsets of `count` windows chosen once, so repeated evaluations score the same text."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(len(ids) - block_size, (count,), generator=generator)


def full_pass_windows(
    ids: torch.Tensor, block_size: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping windows covering a whole split: every character after the first is scored once.

    Batches of whole windows, then the shorter last window on its own.
    """
    n_targets = len(ids) - 1
    n_full = n_targets // block_size
    offsets = torch.arange(block_size + 1)
    for first in range(0, n_full, batch_size):
        starts = torch.arange(first, min(first + batch_size, n_full)) * block_size
        chunk = ids[starts[:, None] + offsets].long()
        yield chunk[:, :-1], chunk[:, 1:]
    rest = n_targets - n_full * block_size
    if rest:
        chunk = ids[n_full * block_size :].long()[None, :]
        yield chunk[:, :-1], chunk[:, 1:]

