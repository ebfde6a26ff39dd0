"""A features column (data.columns): morphological tags such as `V;PST`, each read as one symbol of the encoder's
input beside the source's characters, as the inflection shared tasks and UniMorph ship them.

Each tag the training file uses becomes one character of the vocabulary, taken from Unicode's Supplementary Private
Use Area-B, which no script uses: so `V;PST` is two inputs, and the tag `V` never meets the letter `V`. A source is
held inside charlm as its characters followed by its tags' symbols; users write it as the file has it, the source
then a tab then the features (`walk<TAB>V;PST`). The table of tags (their order gives the symbols) is saved with the
vocabulary: in checkpoints, vocab.json and exports.
"""

from __future__ import annotations

from collections.abc import Sequence

from charlm.errors import UsageError

FEATURE_BASE = 0x100000  # the first symbol: Supplementary Private Use Area-B (U+100000 to U+10FFFD)
UNSEEN_FEATURE = chr(0x10FFFD)  # what a tag the model never saw stands as, where nothing needs its name
FEATURE_RANGE = "U+100000 to U+10FFFD"  # how messages name the symbols' range


def is_feature_symbol(char: str) -> bool:
    return ord(char) >= FEATURE_BASE


class FeatureTable:
    """A model's tags in symbol order (tag i is chr(FEATURE_BASE + i)), and the separator between a line's tags.
    `known` tags are the model's; a copy read with grow=True adds a file's unseen tags after them, so that messages
    can name them, but their symbols are in no vocabulary: they are unknown, as an unseen character is."""

    def __init__(self, tags: Sequence[str] = (), separator: str = ";", known: int | None = None):
        self.tags, self.separator = list(tags), separator
        self.index = {tag: i for i, tag in enumerate(self.tags)}
        self.known = len(self.tags) if known is None else known

    def copy(self) -> FeatureTable:
        return FeatureTable(self.tags, self.separator, self.known)

    def model_tags(self) -> list[str]:
        """What is saved with the vocabulary: the tags the model was trained with."""
        return self.tags[: self.known]

    def split_tags(self, features: str) -> list[str]:
        return [tag for tag in features.split(self.separator) if tag]

    def symbol(self, tag: str, grow: bool = False) -> str:
        """The tag's symbol; an unseen one's grows the table (grow) or is UNSEEN_FEATURE."""
        if tag not in self.index:
            if not grow:
                return UNSEEN_FEATURE
            self.index[tag] = len(self.tags)
            self.tags.append(tag)
        return chr(FEATURE_BASE + self.index[tag])

    def compose(self, source: str, features: str, grow: bool = False) -> str:
        """A source as the encoder reads it: its characters, then one symbol per tag."""
        return source + "".join(self.symbol(tag, grow) for tag in self.split_tags(features))

    def name(self, char: str) -> str | None:
        """The tag a symbol stands for (None: not a symbol of this table)."""
        i = ord(char) - FEATURE_BASE
        return self.tags[i] if 0 <= i < len(self.tags) else None

    def unseen_tags(self, features: str) -> list[str]:
        return [tag for tag in self.split_tags(features) if self.index.get(tag, self.known) >= self.known]

    def shown(self, internal: str) -> str:
        """A source as users write it: its characters, a tab, its tags joined by the separator."""
        chars = "".join(c for c in internal if not is_feature_symbol(c))
        tags = [self.name(c) or "?" for c in internal if is_feature_symbol(c)]
        return f"{chars}\t{self.separator.join(tags)}"

    def label(self, char: str) -> str:
        """How `charlm attention` and the server label one input: a tag as itself, a character as itself."""
        return (self.name(char) or "?") if is_feature_symbol(char) else char

    def given_source(self, text: str, unknown_ok: bool) -> str:
        """A source a user gave (`walk<TAB>V;PST`) as the encoder reads it; a tag the model never saw is refused
        unless `unknown_ok` (--unknown skip or replace), which reads it as unknown."""
        source, tab, features = text.partition("\t")
        if not tab or "\t" in features or not source or not self.split_tags(features):
            raise UsageError(
                f"this model reads a features column: give each source as SOURCE<TAB>FEATURES, both not empty (in "
                f"a shell, --prompt $'walk\\tV{self.separator}PST'), got {text[:60]!r}"
            )
        if not unknown_ok and (unseen := self.unseen_tags(features)):
            raise UsageError(
                f"feature {unseen[0]!r} is not one of the model's {self.known} features; use --unknown replace to "
                "read it as the unknown symbol"
            )
        return self.compose(source, features)


def column_places(columns: str) -> tuple[int, int | None, int]:
    """Where a line's source, features (None: no such column) and target are, counted from 0."""
    names = columns.split("-")
    return names.index("source"), names.index("features") if "features" in names else None, names.index("target")


def layout_words(columns: str) -> str:
    """'source<TAB>features<TAB>target': how messages name a line's layout."""
    return "<TAB>".join(columns.split("-"))
