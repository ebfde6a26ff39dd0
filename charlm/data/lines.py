"""Item lists (data.format: lines): one item per line, read, checked, split by items, and batched whole with padding.

Each line, stripped of the whitespace around it, is one item; a line left empty is skipped. An item is framed as the
pairs format frames a target: the model reads BOS then the item and must predict the item then EOS (the special ids
of charlm/data/tokenizer.py), so no item ever sits in another's sequence. Items longer than the context leaves room
for, and items holding a reserved control character, are counted and the first few named; the file is refused unless
data.skip_bad_lines is set. The split is by items: a shuffle seeded by SPLIT_SEED (the same for every run of a
file), then the validation and test items are taken from the end, as the pairs format does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm.config.schema import DataConfig
from charlm.data.corpus import IGNORE, decode_utf8, for_file, read_text
from charlm.data.records import MODEL_FIX, RecordSplits, refuse_or_skip
from charlm.data.tokenizer import (
    BOS,
    EOS,
    PAD,
    SPECIAL_CHARS,
    SPECIAL_CODES,
    CharTokenizer,
    Tokenizer,
    UnknownPolicy,
    refuse_special_replacement,
)
from charlm.errors import UsageError

Item = list[int]  # an item's ids, without BOS and EOS
RESERVED = f"holding a reserved control character ({SPECIAL_CODES})"


def item_room(block_size: int) -> int:
    """The longest item a model of this context learns whole: BOS and the item fill its positions, and the last
    position predicts EOS."""
    return block_size - 1


def numbered_items(text: str) -> list[tuple[int, str]]:
    """(line number, item) for every line that is not empty once stripped of the whitespace around it."""
    lines = text.split("\n")
    return [(number, line.strip()) for number, line in enumerate(lines, start=1) if line.strip()]


SKIP = "or set data.skip_bad_lines=true to train on the rest"


def training_fix(problems: dict[str, list[int]]) -> str:
    """What to do about a training file's bad items, for the kinds of problem found."""
    if RESERVED not in problems:
        return f"shorten or remove them, raise model.block_size, {SKIP}"
    if len(problems) == 1:
        return f"take the control characters out or remove those lines, {SKIP}"
    return f"shorten the long ones or raise model.block_size, take the control characters out, {SKIP}"


def check_items(
    numbered: list[tuple[int, str]],
    block_size: int,
    skip_bad: bool,
    where: str,
    say: Callable[[str], None],
    fix: str | None = None,
) -> list[str]:
    """The items that fit the context and hold no reserved character; the others refused in one line ending with
    `fix` (None: a training file's, for the problems found) or, with skip_bad, skipped and said."""
    room = item_room(block_size)
    problems: dict[str, list[int]] = {}
    items: list[str] = []
    for number, item in numbered:
        if len(item) > room:
            problems.setdefault(f"longer than the context leaves room for ({room} characters)", []).append(number)
        elif any(c in SPECIAL_CHARS for c in item):
            problems.setdefault(RESERVED, []).append(number)
        else:
            items.append(item)
    refuse_or_skip(problems, where, skip_bad, training_fix(problems) if fix is None else fix, say)
    return items


def read_items(
    path: str | Path, block_size: int, skip_bad: bool, say: Callable[[str], None], fix: str | None = None
) -> list[str]:
    """The items of a file: its non-empty lines, stripped, every problem line reported at once."""
    items = check_items(numbered_items(read_text(path)), block_size, skip_bad, str(path), say, fix)
    if not items:
        raise UsageError(f"{path} holds no non-empty line to train on (data.format lines: one item per line)")
    return items


def items_tokenizer(items: list[str]) -> CharTokenizer:
    """PAD, BOS, EOS, then every character of the items, sorted."""
    return CharTokenizer(SPECIAL_CHARS + sorted({c for item in items for c in item}))


def encode_items(
    items: list[str],
    tokenizer: Tokenizer,
    unknown: UnknownPolicy = "error",
    replacement: str | None = None,
    hint: str = "",
    where: str = "",
) -> list[Item]:
    """Items as ids of a model's vocabulary. Characters it lacks are refused, naming them; `skip` leaves out the
    items that hold one, `replace` puts the replacement character in their place."""
    known = set(tokenizer.chars)
    unknown_chars = sorted({c for item in items for c in item} - known)
    if unknown_chars and unknown == "error":
        shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unknown_chars[:10])
        more = f" and {len(unknown_chars) - 10} more" if len(unknown_chars) > 10 else ""
        raise UsageError(
            f"{where or 'the items'} hold{'s' * bool(where)} {len(unknown_chars)} character(s) the model has never "
            f"seen: {shown}{more}" + (f"; {hint}" if hint else "")
        )
    if unknown == "skip":
        return [tokenizer.encode(item) for item in items if set(item) <= known]
    if unknown == "replace":
        refuse_special_replacement(replacement, "the replacement character")
    if unknown == "replace" and replacement is None:
        replacement = " " if " " in known else tokenizer.chars[len(SPECIAL_CHARS)]  # a real character, never PAD
    return [tokenizer.encode(item, unknown, replacement) for item in items]


class LineCorpus(RecordSplits[Item]):
    """An item list, encoded and split by items."""

    unit = "items"

    @classmethod
    def from_config(
        cls,
        data: DataConfig,
        block_size: int,
        tokenizer: Tokenizer | None = None,
        say: Callable[[str], None] = lambda _: None,
        hint: str = "",
        unknown: UnknownPolicy = "error",
        replacement: str | None = None,
    ) -> LineCorpus:
        fix = None if tokenizer is None else MODEL_FIX
        strings = read_items(data.path, block_size, data.skip_bad_lines, say, fix)
        model_tokenizer = tokenizer or items_tokenizer(strings)
        encoded = encode_items(strings, model_tokenizer, unknown, replacement, hint, data.path)

        def read_given(path: str) -> list[Item]:  # a split given as its own file, in the training file's characters
            chars_fix = hint if tokenizer is not None else f"remove them, or add items that use them to {data.path}"
            given = read_items(path, block_size, data.skip_bad_lines, say, fix)
            return encode_items(given, model_tokenizer, unknown, replacement, chars_fix, path)

        return cls.shuffled(model_tokenizer, encoded, data, read_given)

    def texts(self, name: str) -> set[str]:
        """The items of a split as strings (what `charlm sample --novel` compares with)."""
        decode = self.tokenizer.decode
        return {decode(item) for item in self.split(name)}


GIVEN = ("val", "test")  # the splits a run may be given as their own files (data.val_path, data.test_path)


@dataclass
class KnownItems:
    """The items of every file a run was trained, validated and tested on, as strings: a new item is in none."""

    train: set[str]
    held_out: set[str]  # the validation and test items, carved from data.path or given as their own files
    read: list[str]  # what was read, as messages name it
    gone: list[str]  # the run's files no longer on disk, as messages name them
    unchecked: str = ""  # why none could be read, when that was not for want of files

    def kind(self, text: str) -> str:
        """Which the text is: one of "training", "held_out" and "new"."""
        return "training" if text in self.train else "held_out" if text in self.held_out else "new"

    def counts(self, texts: list[str], sampled: int | None = None) -> dict[str, Any]:
        """{"sampled"} (the draws: `texts`, the whole items among them, and "unfinished" ones cut by a cap or empty),
        and unless no file could be read, how many texts are "training" items, "held_out" items (validation, test) and
        "new" (in no file), "new_share" and "against" (what was read); "missing" names the files no longer on disk,
        "unchecked" says why nothing was compared."""
        out: dict[str, Any] = {"sampled": len(texts) if sampled is None else sampled}
        if out["sampled"] > len(texts):
            out["unfinished"] = out["sampled"] - len(texts)
        if self.read:
            kinds = [self.kind(text) for text in texts]
            out |= {kind: kinds.count(kind) for kind in ("training", "held_out", "new")}
            out |= {"new_share": out["new"] / max(len(texts), 1), "against": self.read}
        if self.gone:
            out["missing"] = self.gone
        if not self.read:
            out["unchecked"] = self.unchecked or f"{'; '.join(self.gone)} not found"
        return out


def known_items(data: DataConfig, block_size: int, tokenizer: Tokenizer) -> KnownItems:
    """The items of a run's files, read as training read them: data.path cut into its splits by LineCorpus, each given
    split file whole (its items with characters the model never saw left out: the model cannot make them). A file no
    longer on disk is left out and named in `gone`."""
    paths = {"data.path": data.path, **{f"data.{split}_path": getattr(data, f"{split}_path") for split in GIVEN}}
    gone = [f"{name} {path}" for name, path in paths.items() if path and not Path(path).exists()]
    known = KnownItems(set(), set(), [], gone)
    given = [split for split in GIVEN if getattr(data, f"{split}_path")]
    if Path(data.path).exists():
        # a given split takes nothing from data.path; left out with its sizes, data.path is cut where training cut it
        blank: tuple[tuple[str, Any], ...] = (("path", ""), ("size", 0), ("fraction", 0.0))
        unset = {f"{split}_{key}": value for split in given for key, value in blank}
        corpus = LineCorpus.from_config(dataclasses.replace(data, **unset), block_size, tokenizer)
        known.train = corpus.texts("train")
        known.held_out = corpus.texts("val") | (corpus.texts("test") if corpus.test else set())
        splits = ["training"] + [name for name, items in (("validation", corpus.val), ("test", corpus.test)) if items]
        named = " and ".join([", ".join(splits[:-1]), splits[-1]] if len(splits) > 1 else splits)
        known.read.append(f"the {named} split{'s' * (len(splits) > 1)} of {data.path}")
    for split in given:
        path = getattr(data, f"{split}_path")
        if Path(path).exists():
            whole = LineCorpus.from_config(for_file(data, path, "all"), block_size, tokenizer, unknown="skip")
            known.held_out |= whole.texts("all")
            known.read.append(f"the {'validation' if split == 'val' else split} file {path}")
    return known


def frame(items: list[Item], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(BOS + item, item + EOS), each (B, T) with T the longest item + 1: PAD after short inputs, IGNORE after short
    targets. Each row is one item, and causal attention looks only backwards, so a position never sees padding or
    another item."""
    T = max(len(item) for item in items) + 1
    inputs = torch.full((len(items), T), PAD, dtype=torch.long)
    targets = torch.full((len(items), T), IGNORE, dtype=torch.long)
    for i, item in enumerate(items):
        inputs[i, : len(item) + 1] = torch.tensor([BOS, *item])
        targets[i, : len(item) + 1] = torch.tensor([*item, EOS])
    return inputs.to(device), targets.to(device)


def in_length_order(items: list[Item], batch_size: int) -> Iterator[list[int]]:
    """Indices of the items in batches of similar lengths (little padding), for scoring."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    for i in range(0, len(order), batch_size):
        yield order[i : i + batch_size]


class LineBatches:
    """Training batches of whole items of similar lengths, drawn with a seeded generator (the pairs format's rule).

    The items are ordered by length once. Each pass over them cuts that order into runs of batch_size neighbours
    (from a random offset, so the cuts move) and takes the runs in a random order: a batch is padded little, and
    every item is trained on once per pass. The generator, the pass's order and the place in it are what a resume
    needs.
    """

    def __init__(self, items: list[Item], batch_size: int, device: torch.device, seed: int):
        self.items, self.batch_size, self.device = items, min(batch_size, len(items)), device
        self.by_length = sorted(range(len(items)), key=lambda i: len(items[i]))
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []  # where each run of this pass starts in by_length (the first may be negative)
        self.cursor = 0
        self.last_tokens = 0  # characters and end symbols of the last batch: what a step trained on

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor >= len(self.order):  # a new pass
            offset = int(torch.randint(self.batch_size, (1,), generator=self.generator))
            starts = list(range(-offset, len(self.items), self.batch_size))
            self.order = [starts[i] for i in torch.randperm(len(starts), generator=self.generator).tolist()]
            self.cursor = 0
        start = self.order[self.cursor]
        self.cursor += 1
        batch = [self.items[i] for i in self.by_length[max(start, 0) : start + self.batch_size]]
        self.last_tokens = sum(len(item) + 1 for item in batch)
        return frame(batch, self.device)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "order": list(self.order), "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.order, self.cursor = list(state.get("order", [])), int(state.get("cursor", 0))


def read_candidates(source: str | Path) -> tuple[str, str]:
    """The text of a file to score, and how messages name it (`charlm score -` reads standard input itself)."""
    path = Path(source)
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "not found"
        raise UsageError(f"file to score {problem}: {path} (give a UTF-8 file, one item per line, or - for stdin)")
    try:
        return decode_utf8(path.read_bytes(), f"file {path}"), str(path)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
