"""A file of independent records (paired lines, list items) split by records: a seeded shuffle, then the validation
and test records taken from the end, so a record is never cut and every run of a file splits it alike."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from charlm.config.schema import DataConfig
from charlm.data.corpus import given_file, split_sizes
from charlm.data.tokenizer import Tokenizer
from charlm.errors import UsageError

SPLIT_SEED = 0  # fixed: the split is the file's, not the run's (a resumed or compared run sees the same records)

Record = TypeVar("Record")


# For a model that exists (scored, or resumed), whose context and data.skip_bad_lines its training fixed.
MODEL_FIX = "fix or remove them (a trained model's context and data.skip_bad_lines stay as they were trained)"


def refuse_or_skip(
    problems: dict[str, list[int]], where: str, skip_bad: bool, fix: str, say: Callable[[str], None]
) -> None:
    """A file's bad lines, each kind with its first five line numbers: refused in one line ending with `fix`, or
    (data.skip_bad_lines) said as skipped."""
    if not problems:
        return
    described = "; ".join(
        f"{len(numbers):,} {what} (line{'s' * (len(numbers) > 1)} {', '.join(map(str, numbers[:5]))}"
        f"{', ...' if len(numbers) > 5 else ''})"
        for what, numbers in problems.items()
    )
    if not skip_bad:
        raise UsageError(f"{where}: {described}; {fix}")
    skipped = sum(map(len, problems.values()))
    say(f"skipping {skipped:,} line{'s' if skipped != 1 else ''} of {where}: {described}")


@dataclass
class RecordSplits(Generic[Record]):
    """A file's records, encoded and split."""

    unit: ClassVar[str] = "records"  # what messages call a record: lines, items
    group_unit: ClassVar[str] = "records"  # what the split counts: records, or the groups that stay together

    @classmethod
    def group_of(cls, record: Any, index: int) -> Any:
        """What keeps records on one side of the split (each record its own group unless a format says otherwise)."""
        return index

    tokenizer: Tokenizer
    train: list[Record]
    val: list[Record]
    test: list[Record]
    source: str = ""

    val_path: str = ""  # the validation split's own file (data.val_path)
    test_path: str = ""  # the test split's own file (data.test_path), read on first use
    read_given: Callable[[str], list[Record]] | None = None  # how a given split file is read

    @classmethod
    def shuffled(
        cls, tokenizer: Tokenizer, records: list[Any], data: DataConfig, read_given: Callable[[str], list[Any]]
    ) -> Any:
        """The records shuffled with SPLIT_SEED and cut into train, val and test by data's fractions or sizes; a split
        given as its own file (data.val_path, data.test_path) is read by `read_given` instead, the test file only
        when the test split is asked for."""
        val_path, test_path = given_file(data, "val"), given_file(data, "test")
        groups: dict[Any, list[Any]] = {}  # records that must stay together, in file order
        for i, record in enumerate(records):
            groups.setdefault(cls.group_of(record, i), []).append(record)
        shuffled = list(groups.values())  # with one record a group, the same shuffle as of the records themselves
        random.Random(SPLIT_SEED).shuffle(shuffled)
        n_train, n_val, _ = split_sizes(len(shuffled), data, data.path, cls.group_unit)
        train, val, test = (
            [r for group in part for r in group]
            for part in (shuffled[:n_train], shuffled[n_train : n_train + n_val], shuffled[n_train + n_val :])
        )
        if val_path:
            val = read_given(val_path)
        return cls(tokenizer, train, val, test, data.path, val_path, test_path, read_given)

    def split(self, name: str) -> list[Record]:
        if name == "all":
            # data.path's records: a split given as its own file is not part of it
            return self.train + (self.val if not self.val_path else []) + (self.test if not self.test_path else [])
        if name not in ("train", "val", "test"):
            raise UsageError(f"split must be one of train, val, test or all, got {name!r}")
        if name == "test" and self.test_path and self.read_given is not None:
            if not self.test:
                self.test = self.read_given(self.test_path)
            return self.test  # the given file's records (none left: the caller says why)
        if name == "test" and not self.test:
            raise UsageError(
                f"{self.source} has no test split: set data.test_path, data.test_fraction or data.test_size when "
                "training"
            )
        return getattr(self, name)

    def check_windows(self, block_size: int, source: str) -> None:
        for name in ("train", "val"):
            if not getattr(self, name):
                fix = f"add lines to {self.val_path}" if name == "val" and self.val_path else "add lines"
                raise UsageError(
                    f"{source} has too few {self.unit}: its {name} split is empty; {fix}"
                    + ("" if name == "val" and self.val_path else " or change data.val_fraction")
                )
