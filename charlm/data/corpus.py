"""From a corpus to tensors of token ids: reading prompts, splitting, random training windows, evaluation passes."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from charlm.config.schema import DataConfig
from charlm.data.prepare import id_dtype, missing_data, prepare, release_mapped_pages
from charlm.data.tokenizer import CharTokenizer, Tokenizer, UnknownPolicy
from charlm.errors import UsageError

# The byte-order mark Windows editors and spreadsheets write first in UTF-8 files: no character of the text.
BOM = "\ufeff"


def read_text(path: str | Path) -> str:
    """Read a file as strict UTF-8; a missing, empty, non-file or non-UTF-8 file is refused with the reason."""
    path = Path(path)
    if not path.exists():
        raise missing_data(path)
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
    """Strict UTF-8, a leading byte-order mark dropped (a text corpus, prepared apart, keeps its bytes as they are)."""
    try:
        return raw.decode("utf-8").removeprefix(BOM)
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
    return torch.tensor(ids, dtype=id_dtype(vocab_size))


SPLITS = ("train", "val", "test")


def split_sizes(n: int, data: DataConfig, source: str, unit: str = "tokens") -> tuple[int, int, int]:
    """Tokens in train, val and test: test is the tail, val just before it, train the rest (in file order).

    Exact sizes win over fractions; with no test split this is nanoGPT's 90/10 split to the character. A split given
    as its own file (data.val_path, data.test_path) takes nothing from this one.
    """
    n_test = data.test_size or (n - int(n * (1 - data.test_fraction)) if data.test_fraction else 0)
    n_val = data.val_size or n - int(n * (1 - data.val_fraction))
    n_val, n_test = (0 if data.val_path else n_val), (0 if data.test_path else n_test)
    if n_val + n_test >= n:
        raise UsageError(
            f"{source} has {n:,} {unit.removesuffix('s') if n == 1 else unit}, but its validation ({n_val:,}) and test "
            f"({n_test:,}) splits leave none for training; lower data.val_size/test_size or the fractions"
        )
    return n - n_val - n_test, n_val, n_test


def for_file(data: DataConfig, path: str | Path, split: str | None = None) -> DataConfig:
    """The data settings for reading `path`: the run's own, given split files included, when it is the run's own
    training file; another file is read whole (its splits cut from it as the fractions say), never beside the run's
    validation or test files, and scored `split` "all" without cutting it (a file of two items has no training
    split to leave)."""
    if same_path(path, data.path):
        return data
    other = dataclasses.replace(data, path=str(path), val_path="", test_path="")
    if split == "all":
        other = dataclasses.replace(other, val_fraction=0.0, val_size=0, test_fraction=0.0, test_size=0)
    return other


def same_path(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def given_file(data: DataConfig, split: str) -> str:
    """The file a split is given as (data.val_path, data.test_path), checked to be there; "" when it is carved from
    data.path. Only its existence is checked: the test file is read by nothing but `charlm eval --split test`."""
    path = getattr(data, f"{split}_path")
    if path and not Path(path).is_file():
        problem = "is a directory" if Path(path).is_dir() else "not found"
        raise UsageError(f"data.{split}_path {problem}: {path} (give a file in the format of data.path)")
    return path


def split_file(data: DataConfig, split: str) -> str:
    """The file a split of `data` is read from: its own given file (data.val_path, data.test_path), else data.path."""
    return {"val": data.val_path, "test": data.test_path}.get(split) or data.path


def same_content(a: str | Path, b: str | Path) -> bool:
    """Whether two files hold the same bytes (the size first, so unequal files are never read)."""
    a, b = Path(a), Path(b)
    if same_path(a, b):
        return True
    if a.stat().st_size != b.stat().st_size:
        return False
    return a.read_bytes() == b.read_bytes()


def conform(
    ids: torch.Tensor,
    own: Tokenizer,
    model: Tokenizer,
    counts: dict[int, int],
    unknown: UnknownPolicy,
    replacement: str | None,
    hint: str,
) -> torch.Tensor:
    """Ids read with the corpus's own vocabulary, rewritten in the model's (a vectorised lookup; no copy when the
    vocabularies agree). Characters the model lacks are refused with their counts, skipped or replaced."""
    if own.kind != model.kind:
        raise UsageError(
            f"the text was read as {own.kind}s but the model reads {model.kind}s; use the model's "
            f"tokenizer (data.tokenizer: {model.kind})"
        )
    if own.kind == "byte" or own.chars == model.chars:
        return ids
    assert isinstance(model, CharTokenizer)
    lut = torch.tensor([model.stoi.get(c, -1) for c in own.chars], dtype=torch.int64)
    missing = [i for i in range(len(own.chars)) if lut[i] < 0 and counts.get(i, 0)]
    if missing:
        if unknown == "error":
            shown = ", ".join(f"{own.chars[i]!r} (U+{ord(own.chars[i]):04X}) x {counts[i]:,}" for i in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise UsageError(f"{len(missing)} character(s) not in the model's vocabulary: {shown}{more}; {hint}")
        if unknown == "replace":
            lut[lut < 0] = model._replacement_id(replacement)
    mapped = lut[ids.long()]
    if unknown == "skip":
        mapped = mapped[mapped >= 0]
    return mapped.to(id_dtype(model.vocab_size))


@dataclass
class Corpus:
    """A corpus prepared once (charlm.data.prepare) and split into train, validation and test ids (memory-mapped
    views)."""

    tokenizer: Tokenizer
    train: torch.Tensor  # (N_train,) compact ids
    val: torch.Tensor  # (N_val,)
    test: torch.Tensor  # (N_test,), empty without a test split
    source: str = ""
    whole: torch.Tensor | None = None  # (N,) all of it, in file order
    test_path: str = ""  # the test split's own file (data.test_path), read on first use
    read_given: Callable[[str], torch.Tensor] | None = None  # how a given split file is read
    val_given: str = ""  # the validation split's own file (data.val_path)

    @classmethod
    def from_config(
        cls,
        data: DataConfig,
        tokenizer: Tokenizer | None = None,
        unknown: UnknownPolicy = "error",
        hint: str = "use --unknown skip or --unknown replace to accept them",
        say: Callable[[str], None] = lambda _: None,
        replacement: str | None = None,
    ) -> Corpus:
        kind = tokenizer.kind if tokenizer else data.tokenizer
        prepared = prepare(data.path, kind, say)
        ids = prepared.ids
        if tokenizer is not None:
            ids = conform(ids, prepared.tokenizer, tokenizer, prepared.counts, unknown, replacement, hint)
        corpus = cls.from_ids(ids, tokenizer or prepared.tokenizer, data, data.path)
        val_path, corpus.test_path = given_file(data, "val"), given_file(data, "test")
        if val_path or corpus.test_path:

            def read_given(path: str) -> torch.Tensor:  # in the training file's vocabulary, the policy as above
                given = prepare(path, kind, say)
                own = f"{path} holds characters the training file {data.path} lacks"
                return conform(
                    given.ids, given.tokenizer, corpus.tokenizer, given.counts, unknown, replacement,
                    f"{own}; remove them, or add text that uses them to {data.path}",
                )  # fmt: skip

            corpus.read_given, corpus.val_given = read_given, val_path
            if val_path:
                corpus.val = read_given(val_path)
        return corpus

    @classmethod
    def from_ids(cls, ids: torch.Tensor, tokenizer: Tokenizer, data: DataConfig, source: str) -> Corpus:
        n_train, n_val, _ = split_sizes(len(ids), data, source)
        return cls(tokenizer, ids[:n_train], ids[n_train : n_train + n_val], ids[n_train + n_val :], source, ids)

    @classmethod
    def from_file(
        cls, path: str | Path, val_fraction: float, tokenizer: Tokenizer | None = None, unknown: UnknownPolicy = "error"
    ) -> Corpus:
        """A character corpus with only a validation split (the simple case, kept for scripts and tests)."""
        return cls.from_config(DataConfig(path=str(path), val_fraction=val_fraction), tokenizer, unknown)

    def split(self, name: str) -> torch.Tensor:
        """One split's ids by name: train, val, test, or all (the whole corpus)."""
        if name == "all" and self.whole is not None:
            return self.whole
        if name not in SPLITS:
            raise UsageError(f"split must be one of {', '.join(SPLITS)} or all, got {name!r}")
        if name == "test" and self.test_path and self.read_given is not None:
            if not len(self.test):
                self.test = self.read_given(self.test_path)
            return self.test
        if name == "test" and not len(self.test):
            raise UsageError(
                f"{self.source} has no test split: set data.test_path, data.test_size or data.test_fraction when "
                "training (the test split is held out from the start)"
            )
        return getattr(self, name)

    def check_windows(self, block_size: int, source: str) -> None:
        """Both splits must hold at least one whole window (block_size inputs plus the next character)."""
        need = block_size + 1
        for name, ids in (("training", self.train), ("validation", self.val)):
            if len(ids) < need:
                given = name == "validation" and self.val_given
                raise UsageError(
                    f"{'the validation file' if given else 'data file'} {self.val_given if given else source} is "
                    f"too short: its {name} split has {len(ids)} tokens but a window needs {need} (model.block_size "
                    "+ 1); use a longer text, a smaller model.block_size"
                    + (
                        " or more held out: data.val_size (or, while it is 0, data.val_fraction)"
                        if name == "validation" and not given
                        else ""
                    )
                )


class RandomWindows:
    """Training batches of random windows drawn with a seeded generator: x, and y = x shifted by one.

    (Not a "sampler": in charlm, sampling means generating text.)"""

    def __init__(self, ids: torch.Tensor, block_size: int, batch_size: int, device: torch.device, seed: int):
        self.ids = ids
        self.block_size = block_size
        self.batch_size = batch_size
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(block_size + 1)  # (T+1,)
        self.pin = device.type == "cuda"
        self.last_tokens = batch_size * block_size  # the targets a batch holds: every position of every window

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.ids) - self.block_size, (self.batch_size,), generator=self.generator)
        release_mapped_pages()  # resident memory stays flat however big the corpus
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


IGNORE = -100  # a target the loss skips (torch's cross_entropy ignore_index)


def strided_windows(
    ids: torch.Tensor, block_size: int, stride: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Sliding windows `stride` apart; each scores only the targets the one before did not, so every character after
    the first is scored exactly once, and each after the first window sees at least block_size - stride earlier
    characters (stride 1: the fixed-context protocol of the papers). Unscored targets are IGNORE."""
    T, n_targets = block_size, len(ids) - 1
    if n_targets <= T:
        chunk = ids.long()[None, :]
        yield chunk[:, :-1], chunk[:, 1:]
        return
    starts = torch.arange(0, n_targets - T + 1, stride)  # (W,)
    first = torch.full_like(starts, T - stride)  # index in the window of the first target scored
    first[0] = 0
    covered = int(starts[-1]) + T  # targets 1..covered are scored so far
    if covered < n_targets:  # a last window flush with the end, scoring what is left
        starts = torch.cat([starts, torch.tensor([n_targets - T])])
        first = torch.cat([first, torch.tensor([T - (n_targets - covered)])])
    offsets, positions = torch.arange(T + 1), torch.arange(T)
    for i in range(0, len(starts), batch_size):
        chunk = ids[starts[i : i + batch_size, None] + offsets].long()  # (B, T+1)
        y = chunk[:, 1:].clone()
        y[positions[None, :] < first[i : i + batch_size, None]] = IGNORE
        yield chunk[:, :-1], y
