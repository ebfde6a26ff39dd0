"""Paired data (data.format: pairs): source<TAB>target lines read, checked, split, and batched with padding.

Every problem line is counted and the first few are named; the file is refused unless data.skip_bad_lines is set.
The split is by sources: the lines of one source stay together, the sources are shuffled with SPLIT_SEED (the same
for every run of a file), then the validation and test sources are taken from the end, as the text format takes its
splits from the end of the text. (With every source on one line, that is a shuffle of the lines.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

from charlm.config.schema import DataConfig
from charlm.data.corpus import IGNORE, read_text
from charlm.data.features import (
    FEATURE_BASE,
    FEATURE_RANGE,
    FeatureTable,
    column_places,
    is_feature_symbol,
    layout_words,
)
from charlm.data.records import MODEL_FIX, RecordSplits, refuse_or_skip
from charlm.data.tokenizer import (
    BOS,
    EOS,
    PAD,
    SPECIAL_CHARS,
    SPECIAL_CODES,
    UNKNOWN_CHAR,
    CharTokenizer,
    Tokenizer,
    UnknownPolicy,
)
from charlm.errors import UsageError

Pair = tuple[list[int], list[int]]  # source ids, target ids (without BOS/EOS)


TRAINING_FIX = "fix them, or set data.skip_bad_lines=true to train on the other lines"


class Unseen(NamedTuple):
    """What of a file the model never saw: how many characters (and features, with a features column) were read as
    the unknown symbol (or another replacement), how many lines held one (replaced, or left out with --unknown skip),
    and in how many of those lines a target did: one a hypothesis matches only by copying it from the source."""

    chars: int
    lines: int
    target_lines: int = 0
    features: int = 0

    def words(self, path: str) -> str:
        """'kor_dev.tsv: 37 characters the training file lacks, in 30 lines, read as the unknown symbol ...'"""
        targets = (
            f"; {self.target_lines} of those lines' targets hold one: right only where the model copies it from the "
            "source"
            if self.target_lines
            else ""
        )
        counted = [(self.chars, "character"), (self.features, "feature")]
        what = " and ".join(f"{n} {noun}{'s' * (n != 1)}" for n, noun in counted if n or noun == "character")
        if self.features and not self.chars:
            what = f"{self.features} feature{'s' * (self.features != 1)}"
        return (
            f"{path}: {what} the training file lacks, in {self.lines} line{'s' * (self.lines != 1)}, read as the "
            f"unknown symbol (data.unknown_dropout){targets}"
        )


def read_pairs(
    path: str | Path,
    block_size: int,
    skip_bad: bool,
    say: Callable[[str], None],
    fix: str = TRAINING_FIX,
    table: FeatureTable | None = None,
    columns: str = "source-target",
) -> list[tuple[str, str]]:
    """The (source, target) strings of a TSV file, every problem line reported at once, refused ending with `fix`.
    With a features column (`table`, in the `columns` order), a source is its characters then one symbol per
    feature (charlm/data/features.py); the table grows with features it has not seen."""
    text = read_text(path)
    problems: dict[str, list[int]] = {}
    pairs: list[tuple[str, str]] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    at_source, at_features, at_target = column_places(columns)
    tabs = len(columns.split("-")) - 1
    for number, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        parts = line.split("\t")
        if len(parts) != tabs + 1:
            problem = "without exactly one tab" if tabs == 1 else f"without exactly two tabs ({layout_words(columns)})"
            problems.setdefault(problem, []).append(number)
        elif not all(parts):
            problems.setdefault("with an empty side" if tabs == 1 else "with an empty column", []).append(number)
        elif any(c in SPECIAL_CHARS for c in line):
            problems.setdefault(f"holding a reserved control character ({SPECIAL_CODES})", []).append(number)
        elif table is not None and any(is_feature_symbol(c) for c in line):
            problems.setdefault(f"holding a character of {FEATURE_RANGE} (kept for features)", []).append(number)
        else:
            source, target = parts[at_source], parts[at_target]
            features = parts[at_features] if table is not None and at_features is not None else None
            inputs = len(source) + (len(table.split_tags(features)) if table is not None and features else 0)
            if inputs > block_size or len(target) + 1 > block_size:
                problems.setdefault(
                    f"longer than the context (source > {block_size} or target > {block_size - 1})", []
                ).append(number)
            else:  # a line kept: its features join the table
                pairs.append(
                    (source if table is None or features is None else table.compose(source, features, True), target)
                )
    refuse_or_skip(problems, str(path), skip_bad, fix, say)
    if not pairs:
        raise UsageError(f"{path} holds no {layout_words(columns)} line to train on")
    return pairs


def pair_tokenizer(
    pairs: list[tuple[str, str]], with_unknown: bool = False, features: FeatureTable | None = None
) -> CharTokenizer:
    """PAD, BOS, EOS, then every character of both sides (a features column's symbols last) and (with_unknown)
    the unknown symbol, sorted."""
    chars = {c for s, t in pairs for c in s + t} | ({UNKNOWN_CHAR} if with_unknown else set())
    return CharTokenizer(SPECIAL_CHARS + sorted(chars), features)


def named(char: str, table: FeatureTable | None) -> str:
    """How a message names one unseen input: a feature by its name, a character with its code point."""
    if table is not None and is_feature_symbol(char):
        return f"feature {table.name(char)!r}"
    return f"{char!r} (U+{ord(char):04X})"


class PairCorpus(RecordSplits[Pair]):
    """A paired file, encoded and split by sources: the lines of one source (a word's alternate pronunciations) stay
    on one side of the split, so no test word was trained on with another of its answers."""

    unit = "lines"
    group_unit = "sources"

    @classmethod
    def group_of(cls, record: Pair, index: int) -> Any:
        return tuple(record[0])

    # For each file read so far (the test file is read when asked for): its characters the model never saw.
    unknown_counts: Mapping[str, Unseen] = {}  # replaced per instance, never mutated: one shared default

    @classmethod
    def from_config(
        cls,
        data: DataConfig,
        block_size: int,
        tokenizer: Tokenizer | None = None,
        say: Callable[[str], None] = lambda _: None,
        hint: str = "",
        unknown: UnknownPolicy | None = None,
        replacement: str | None = None,
    ) -> PairCorpus:
        """The pairs of data.path (and of the given split files), in `tokenizer`'s characters (default: a vocabulary
        of the training file's). Characters it lacks are refused by name (`unknown` error), their lines left out
        (skip), or read as the replacement (replace; default: the learned unknown symbol when the model has one).
        With no `unknown` given (training), a model with that symbol reads a given validation or test file's such
        characters as it, said and counted, as it was trained to (data.unknown_dropout): a shared task's own dev
        file need not be edited to be used; the training file's own are refused."""
        line_fix = TRAINING_FIX if tokenizer is None else MODEL_FIX
        table = feature_reading(data, tokenizer)  # grows with the features of each file read
        strings = read_pairs(data.path, block_size, data.skip_bad_lines, say, line_fix, table, data.columns)
        if tokenizer is None and table is not None:  # a new model's features: sorted, so their order is the data's
            strings, table = sorted_features(strings, table)
        model_features = FeatureTable(table.tags, table.separator) if table is not None else None
        model_tokenizer = tokenizer or pair_tokenizer(strings, data.unknown_dropout > 0, model_features)
        known = set(model_tokenizer.chars)
        counts: dict[str, Unseen] = {}

        def encoded(path: str, strings: list[tuple[str, str]], hint: str, policy: UnknownPolicy) -> list[Pair]:
            unseen = sorted({c for s, t in strings for c in s + t} - known)
            if unseen and policy == "error":
                shown = ", ".join(named(c, table) for c in unseen[:10])
                raise UsageError(
                    f"{path} has characters the model has never seen: {shown}" + (f"; {hint}" if hint else "")
                )
            if unseen:
                held = [sum(c not in known for c in s + t) for s, t in strings]
                in_targets = sum(any(c not in known for c in t) for _, t in strings)
                features = sum(is_feature_symbol(c) and c not in known for s, _ in strings for c in s)
                replaced = policy == "replace"
                counts[path] = Unseen(
                    sum(held) - features if replaced else 0, sum(n > 0 for n in held), in_targets, features * replaced
                )
                if policy == "skip":
                    strings = [pair for pair, n in zip(strings, held, strict=True) if not n]
            fill = pair_replacement(model_tokenizer, replacement)
            encode = model_tokenizer.encode
            out: list[Pair] = []
            features = table is not None
            for s, t in strings:
                source = encode(s, policy, fill)
                target = encode(t, policy, fill)
                out.append(
                    (
                        ReplacedSource(source, unseen_of(s, known, features)) if unseen and set(s) - known else source,
                        ReplacedTarget(target, t) if unseen and set(t) - known else target,
                    )
                )
            return out

        def read_given(path: str) -> list[Pair]:  # a split given as its own file, in the training file's characters
            fix = (
                hint
                if tokenizer is not None
                else (
                    f"remove them, add lines that use them to {data.path}, or set data.unknown_dropout (e.g. "
                    "0.01): the model then learns an unknown symbol and reads them as it"
                )
            )
            learned = UNKNOWN_CHAR in known and unknown is None  # read as the symbol it was trained for
            pairs = read_pairs(path, block_size, data.skip_bad_lines, say, line_fix, table, data.columns)
            out = encoded(path, pairs, fix, "replace" if learned else unknown or "error")
            if learned and path in counts:
                say(counts[path].words(path))
            return out

        corpus = cls.shuffled(model_tokenizer, encoded(data.path, strings, hint, unknown or "error"), data, read_given)
        corpus.unknown_counts = counts
        return corpus


def sorted_features(strings: list[tuple[str, str]], table: FeatureTable) -> tuple[list[tuple[str, str]], FeatureTable]:
    """A training file's lines and features with the features' symbols in sorted order of their names, not in the
    order the file first uses them: two copies of a file in another order give the same vocabulary."""
    order = sorted(table.tags)
    symbols = {ord(table.symbol(tag)): chr(FEATURE_BASE + i) for i, tag in enumerate(order)}
    return [(source.translate(symbols), target) for source, target in strings], FeatureTable(order, table.separator)


def feature_reading(data: DataConfig, tokenizer: Tokenizer | None) -> FeatureTable | None:
    """The features table files are read with: none without a features column, else a copy of the model's (a
    file's unseen features grow the copy, never the model's), or an empty one for a new model."""
    if data.columns == "source-target":
        return None
    if tokenizer is not None and tokenizer.features is not None:
        return tokenizer.features.copy()
    return FeatureTable(separator=data.feature_separator)


class ReplacedTarget(list):
    """A target's ids in which characters the model never saw were replaced, with the target as the file has it
    (`text`): scoring compares what the model writes with that, so the line counts as right only where the model
    put the unknown symbol in their place and the source's unseen characters went back into it (restore_unknown),
    never because a stand-in matched a stand-in."""

    def __init__(self, ids: list[int], text: str):
        super().__init__(ids)
        self.text = text


class ReplacedSource(list):
    """A source's ids in which characters the model never saw were replaced (--unknown replace). Two different
    words can then read alike (a한b and a글b both as a, the unknown symbol, b), so scoring takes each such source
    for a word of its own, never for another line of the same word."""

    def __init__(self, ids: list[int], unseen: str):
        super().__init__(ids)
        self.unseen = unseen  # the characters that were replaced, in their order: what the unknown symbol gives back


def unseen_of(source: str, known: set[str], features: bool = False) -> str:
    """A source's characters outside the model's vocabulary, in their order (with a features column its symbols
    left out: an unseen feature is no character to write)."""
    return "".join(c for c in source if c not in known and not (features and is_feature_symbol(c)))


def pair_replacement(tokenizer: Tokenizer, replacement: str | None) -> str | None:
    """What `--unknown replace` puts in a pair for a character the model never saw: the given character, else the
    learned unknown symbol (data.unknown_dropout), else a space, else the first real character (never a special)."""
    chars = getattr(tokenizer, "chars", [])
    if replacement is not None or not chars:
        return replacement
    return next(c for c in (UNKNOWN_CHAR, " ", chars[len(SPECIAL_CHARS)]) if c in chars)


def pad_batch(pairs: list[Pair], device: torch.device) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """((source (B, S), BOS + target (B, T)), target + EOS (B, T)): PAD after short sources and inputs, IGNORE after
    short targets, so padding is never attended to (sources) or scored (targets)."""
    S = max(len(s) for s, _ in pairs)
    T = max(len(t) for _, t in pairs) + 1
    src = torch.full((len(pairs), S), PAD, dtype=torch.long)
    tgt_in = torch.full((len(pairs), T), PAD, dtype=torch.long)
    targets = torch.full((len(pairs), T), IGNORE, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s)] = torch.tensor(s)
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS, *t])
        targets[i, : len(t) + 1] = torch.tensor([*t, EOS])
    return (src.to(device), tgt_in.to(device)), targets.to(device)


class PairBatches:
    """Training batches of pairs of similar lengths, drawn with a seeded generator (the text format's RandomWindows).

    The lines are ordered by length once. Each pass over them cuts that order into runs of batch_size neighbours
    (from a random offset, so the cuts move) and takes the runs in a random order: a batch is padded little (on
    CMUdict, random batches were mostly padding: the longest of 64 words sets the width), and every line is
    trained on once per pass. The generator, the pass's order and the place in it are the state a resume needs.
    """

    def __init__(
        self,
        pairs: list[Pair],
        batch_size: int,
        device: torch.device,
        seed: int,
        unknown_id: int | None = None,
        unknown_dropout: float = 0.0,
    ):
        self.pairs, self.batch_size, self.device = pairs, min(batch_size, len(pairs)), device
        self.unknown_id, self.unknown_dropout = unknown_id, unknown_dropout  # data.unknown_dropout
        self.by_length = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][1]), len(pairs[i][0])))
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []  # where each run of this pass starts in by_length (the first may be negative)
        self.cursor = 0
        self.last_tokens = 0  # target characters (with EOS) of the last batch: what a step trained on

    def next_batch(self) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        if self.cursor >= len(self.order):  # a new pass
            offset = int(torch.randint(self.batch_size, (1,), generator=self.generator))
            starts = list(range(-offset, len(self.pairs), self.batch_size))
            self.order = [starts[i] for i in torch.randperm(len(starts), generator=self.generator).tolist()]
            self.cursor = 0
        start = self.order[self.cursor]
        self.cursor += 1
        batch = [self.pairs[i] for i in self.by_length[max(start, 0) : start + self.batch_size]]
        self.last_tokens = sum(len(t) + 1 for _, t in batch)
        if self.unknown_id is None or not self.unknown_dropout:
            return pad_batch(batch, self.device)
        (src, tgt_in), targets = pad_batch(batch, torch.device("cpu"))
        # Now and then a character of a source is read as the unknown symbol, everywhere in it and in its target
        # alike, drawn from the batches' own generator (so a resumed run draws the same): the model learns to go on
        # past a character it cannot read, and to write the symbol where that character is copied into the target
        # (decoding puts the source's character back: restore_unknown).
        vocab = int(max(src.max(), tgt_in.max(), targets.max())) + 1
        present = torch.zeros(len(batch), vocab, dtype=torch.bool).scatter_(1, src, True)  # (B, V)
        present[:, PAD] = False
        drop = present & (torch.rand(present.shape, generator=self.generator) < self.unknown_dropout)  # (B, V)
        src = torch.where(drop.gather(1, src), self.unknown_id, src)
        tgt_in = torch.where(drop.gather(1, tgt_in), self.unknown_id, tgt_in)
        scored = targets != IGNORE
        targets = torch.where(drop.gather(1, targets.clamp(min=0)) & scored, self.unknown_id, targets)
        return (src.to(self.device), tgt_in.to(self.device)), targets.to(self.device)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "order": list(self.order), "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.order, self.cursor = list(state.get("order", [])), int(state.get("cursor", 0))


def in_batches(pairs: list[Pair], batch_size: int) -> Iterator[list[Pair]]:
    """Batches in order of length (less padding), for scoring and decoding."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    for i in range(0, len(order), batch_size):
        yield [pairs[j] for j in order[i : i + batch_size]]
