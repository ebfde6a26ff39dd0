"""Character tokenizer: ids are positions in the sorted set of characters of the training text."""

from __future__ import annotations

import json
from typing import Literal

from charlm.errors import UsageError

UnknownPolicy = Literal["error", "skip", "replace"]
UNKNOWN_POLICIES = ("error", "skip", "replace")


class CharTokenizer:
    def __init__(self, chars: str | list[str]):
        chars = list(chars)
        if not chars:
            raise UsageError("cannot build a vocabulary from an empty text")
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise UsageError("a vocabulary must list distinct single characters")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))  # sorted, so the same text always gives the same ids

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str, unknown: UnknownPolicy = "error", replacement: str | None = None) -> list[int]:
        if unknown not in UNKNOWN_POLICIES:
            raise UsageError(f"unknown-character policy must be one of {', '.join(UNKNOWN_POLICIES)}, got {unknown!r}")
        stoi = self.stoi
        if all(c in stoi for c in set(text)):
            return [stoi[c] for c in text]
        if unknown == "error":
            raise UsageError(self._unknown_message(text))
        if unknown == "skip":
            return [stoi[c] for c in text if c in stoi]
        fill = self._replacement_id(replacement)
        return [stoi.get(c, fill) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def unknown_chars(self, text: str) -> list[str]:
        return sorted(set(text) - self.stoi.keys())

    def _replacement_id(self, replacement: str | None) -> int:
        if replacement is None:
            replacement = " " if " " in self.stoi else self.chars[0]
        if replacement not in self.stoi:
            raise UsageError(f"the replacement character {replacement!r} is not in the vocabulary; choose one that is")
        return self.stoi[replacement]

    def _unknown_message(self, text: str) -> str:
        unknown = self.unknown_chars(text)
        shown = ", ".join(f"{c!r} (U+{ord(c):04X}) at position {text.index(c)}" for c in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        return (
            f"{len(unknown)} character(s) not in the model's vocabulary: {shown}{more}; "
            "use --unknown skip or --unknown replace to accept them"
        )

    # JSON round-trip (never pickle): the vocabulary is just its characters in id order.
    def to_json(self) -> str:
        return json.dumps({"chars": self.chars}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        try:
            chars = json.loads(text)["chars"]
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"not a charlm vocabulary (expected JSON with a 'chars' list): {e}") from e
        if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars):
            raise UsageError("not a charlm vocabulary: 'chars' must be a list of characters")
        return cls(chars)
