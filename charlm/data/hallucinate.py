"""Data hallucination for small inflection sets (data.hallucinate; Anastasopoulos & Neubig 2019): synthetic training
lines made from real ones by replacing the stem, the longest stretch the lemma and its form share, with random
characters of the training sources, in both. The model sees more lemmas inflected by the same rules, so it learns to
copy what it does not know instead of memorising the few stems it was shown. Only training batches get them: the
validation and test lines are never touched.
"""

from __future__ import annotations

import random

from charlm.data.features import is_feature_symbol
from charlm.data.pairs import Pair
from charlm.data.tokenizer import SPECIAL_CHARS, UNKNOWN_CHAR, Tokenizer

SHORTEST_STEM = 3  # a shared stretch shorter than this is more likely an affix than a stem


def longest_shared(a: list[int], b: list[int]) -> tuple[int, int, int]:
    """The longest stretch a and b share: its start in a, its start in b, its length (0: none)."""
    best = (0, 0, 0)
    previous = [0] * (len(b) + 1)
    for i in range(1, len(a) + 1):
        current = [0] * (len(b) + 1)
        for j in range(1, len(b) + 1):
            if a[i - 1] == b[j - 1]:
                current[j] = previous[j - 1] + 1
                if current[j] > best[2]:
                    best = (i - current[j], j - current[j], current[j])
        previous = current
    return best


def hallucinated(train: list[Pair], tokenizer: Tokenizer, count: int, seed: int) -> list[Pair]:
    """`count` synthetic lines from the training lines (fewer when no line shares a stem of SHORTEST_STEM), the same
    for the same lines and seed (a resumed run, every DDP rank). A source's features stay as they are."""
    if count == 0:
        return []
    chars = tokenizer.chars
    features = {i for i, c in enumerate(chars) if is_feature_symbol(c)}
    skipped = set(SPECIAL_CHARS) | {UNKNOWN_CHAR}
    alphabet = sorted({i for s, _ in train for i in s if i not in features and chars[i] not in skipped})
    stems = []
    for source, target in train:
        letters = [i for i in source if i not in features]
        at_source, at_target, length = longest_shared(letters, list(target))
        if length >= SHORTEST_STEM:
            stems.append((letters, source[len(letters) :], target, at_source, at_target, length))
    if not stems or not alphabet:
        return []
    rng = random.Random(seed)
    made: list[Pair] = []
    for _ in range(count):
        letters, tags, target, at_source, at_target, length = stems[rng.randrange(len(stems))]
        stem = [rng.choice(alphabet) for _ in range(length)]
        source = letters[:at_source] + stem + letters[at_source + length :] + list(tags)
        made.append((source, list(target[:at_target]) + stem + list(target[at_target + length :])))
    return made
