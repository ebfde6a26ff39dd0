"""Tokenizers: characters (ids are positions in the sorted set of the training text's characters) or raw bytes."""

from __future__ import annotations

import codecs
import json
from typing import ClassVar, Literal, Union

from charlm.data.features import FeatureTable
from charlm.errors import UsageError

UnknownPolicy = Literal["error", "skip", "replace"]
UNKNOWN_POLICIES = ("error", "skip", "replace")
TokenizerKind = Literal["char", "byte"]
REPLACEMENT = "\ufffd"  # what a byte sequence that is not UTF-8 shows as

# The special ids of framed sequences (paired data: a target starts after BOS and ends with EOS; batches pad with
# PAD), the first three ids of such a vocabulary.
PAD, BOS, EOS = 0, 1, 2
SPECIAL_CHARS = ["\x00", "\x02", "\x03"]  # NUL, STX, ETX: the characters of ids 0, 1, 2 in a paired vocabulary
SPECIAL_CODES = ", ".join(f"U+{ord(c):04X}" for c in SPECIAL_CHARS)  # how messages name them


def refuse_special_replacement(replacement: str | None, what: str) -> None:
    """A replacement that is padding, start or end would pad or end an item in its middle: refused in one line that
    names what gave it (a flag, or "the replacement character")."""
    if replacement in SPECIAL_CHARS:
        raise UsageError(
            f"{what} U+{ord(replacement):04X} is one of the model's padding, start and end symbols "
            f"({SPECIAL_CODES}): choose a character of its text"
        )


# The unknown symbol (U+001A SUBSTITUTE, ASCII's mark for a character that cannot be shown): a paired vocabulary
# trained with data.unknown_dropout holds it, and `--unknown replace` then puts it where a character is unknown.
UNKNOWN_CHAR = "\x1a"


def restore_unknown(target: str, unseen: str) -> str:
    """A written target with each unknown symbol in it replaced by the source's unseen characters in their order (the
    last again once they run out): a model trained with data.unknown_dropout writes the symbol where the character
    it could not read goes (a Japanese stem's new kanji, a name's foreign letter). Unchanged where none was unseen."""
    if not unseen or UNKNOWN_CHAR not in target:
        return target
    parts = target.split(UNKNOWN_CHAR)
    return parts[0] + "".join(unseen[min(i, len(unseen) - 1)] + part for i, part in enumerate(parts[1:]))


def check_unknown_policy(unknown: str) -> None:
    if unknown not in UNKNOWN_POLICIES:
        raise UsageError(f"unknown-character policy must be one of {', '.join(UNKNOWN_POLICIES)}, got {unknown!r}")


class CharTokenizer:
    """One id per distinct character of the training text; text must be valid UTF-8. A vocabulary of pairs with a
    features column also holds one symbol per feature, named by `features` (charlm/data/features.py)."""

    kind: TokenizerKind = "char"
    unit = "char"

    def __init__(self, chars: str | list[str], features: FeatureTable | None = None):
        chars = list(chars)
        if not chars:
            raise UsageError("cannot build a vocabulary from an empty text")
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise UsageError("a vocabulary must list distinct single characters")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.features = features

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))  # sorted, so the same text always gives the same ids

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str, unknown: UnknownPolicy = "error", replacement: str | None = None) -> list[int]:
        check_unknown_policy(unknown)
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

    def label(self, i: int) -> str:
        """One input as people read it: a character as itself, a feature as its name (`V`, `PST`)."""
        return self.features.label(self.chars[i]) if self.features is not None else self.chars[i]

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)

    def replaced(self, ids: list[int]) -> int:
        """Characters shown as U+FFFD because the ids are not valid text: never, for characters."""
        return 0

    def unknown_chars(self, text: str) -> list[str]:
        return sorted(set(text) - self.stoi.keys())

    def _replacement_id(self, replacement: str | None) -> int:
        if replacement is None:  # the learned unknown symbol, else a space, else the first character
            replacement = next(c for c in (UNKNOWN_CHAR, " ", self.chars[0]) if c in self.stoi)
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

    # JSON round-trip (never pickle): the vocabulary is its characters in id order, and the features' names (in
    # their symbols' order) where it has a features column.
    def to_json(self) -> str:
        features = {"features": self.features.model_tags()} if self.features is not None else {}
        return json.dumps({"chars": self.chars} | features, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, separator: str = ";") -> CharTokenizer:
        try:
            saved = json.loads(text)
            chars = saved["chars"]
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"not a charlm vocabulary (expected JSON with a 'chars' list): {e}") from e
        if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars):
            raise UsageError("not a charlm vocabulary: 'chars' must be a list of characters")
        return cls(chars, feature_table(saved.get("features"), separator))


class ByteTokenizer:
    """Ids are byte values (0-255): any file is accepted, text is its UTF-8 encoding, and output bytes that are not
    valid UTF-8 are shown as U+FFFD (counted by `replaced`)."""

    kind: TokenizerKind = "byte"
    unit = "byte"
    vocab_size = 256
    features = None  # bytes have no features column
    chars: ClassVar[list[str]] = [
        chr(b) for b in range(256)
    ]  # labels only (Latin-1); decode() is the real reading of ids

    def encode(self, text: str, unknown: UnknownPolicy = "error", replacement: str | None = None) -> list[int]:
        check_unknown_policy(unknown)  # every text has bytes: nothing is ever unknown
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)

    def replaced(self, ids: list[int]) -> int:
        """How many U+FFFD the decoded text holds beyond those the bytes really encode (EF BF BD)."""
        raw = bytes(ids)
        return raw.decode("utf-8", errors="replace").count(REPLACEMENT) - raw.count(REPLACEMENT.encode())

    def unknown_chars(self, text: str) -> list[str]:
        return []

    def label(self, i: int) -> str:
        return self.chars[i]

    def to_json(self) -> str:
        return json.dumps({"bytes": True})


Tokenizer = Union[CharTokenizer, ByteTokenizer]


class StreamDecoder:
    """Text for ids arriving one at a time: a character split over several bytes appears once it is whole."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.bytes = codecs.getincrementaldecoder("utf-8")(errors="replace") if tokenizer.kind == "byte" else None

    def feed(self, token: int) -> str:
        if self.bytes is None:
            return self.tokenizer.chars[token]
        return self.bytes.decode(bytes((token,)))

    def flush(self) -> str:
        """What is left at the end: an unfinished byte sequence shows as U+FFFD."""
        return self.bytes.decode(b"", final=True) if self.bytes is not None else ""


def feature_table(tags: object, separator: str, columns: str = "source-target") -> FeatureTable | None:
    """A saved vocabulary's features (None: it has no features column), checked against the config's data.columns."""
    if tags is None:
        if columns != "source-target":
            raise UsageError(f"its data.columns is {columns}, but its vocabulary lacks the features' names")
        return None
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise UsageError("not a charlm vocabulary: 'features' must be a list of feature names")
    return FeatureTable(tags, separator)


def make_tokenizer(
    kind: str, vocab: list | None, features: object = None, separator: str = ";", columns: str = "source-target"
) -> Tokenizer:
    """The tokenizer a config and a saved vocabulary describe (the one place that decides); `features`: the saved
    features' names, read with the config's data.feature_separator and checked against its data.columns."""
    if kind == "byte":
        return ByteTokenizer()
    return CharTokenizer(vocab or [], feature_table(features, separator, columns))


def tokenizer_from_json(kind: str, text: str, separator: str = ";", columns: str = "source-target") -> Tokenizer:
    if kind == "byte":
        return ByteTokenizer()
    tokenizer = CharTokenizer.from_json(text, separator)
    if tokenizer.features is None:
        feature_table(None, separator, columns)  # a features model's vocabulary must name its features
    return tokenizer
