"""Recombination for small pronunciation lists (data.recombine): synthetic training pairs made by joining the head of
one word to the tail of another at a letters-to-sounds unit they share, both sides cut at the same place. The units
come from an alignment learned from the training pairs themselves (EM over units of one or two letters and none, one
or two sounds: silent letters, digraphs, x as k s, a glottal stop no letter writes). A model shown a few hundred
words then meets each spelling rule in many more words. Only training batches get them: the validation and test
lines are never touched.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable

from charlm.data.pairs import Pair

Unit = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]  # some source ids and the target tokens they are spoken as
SHAPES = ((1, 1), (1, 0), (2, 1), (1, 2), (0, 1))  # (source characters, target tokens) a unit may take
ROUNDS = 5  # EM rounds: each re-estimates the units' probabilities from the expected counts of the round before
UNSEEN = 20.0  # the cost of a unit no cut has used yet: taken only where no known one fits


def tokens(target: list[int], space: int | None) -> list[tuple[int, ...]]:
    """A target's tokens: its space-separated symbols (phones) where the list's targets are spaced (`space`: the
    space's id), else each character."""
    if space is None:
        return [(i,) for i in target]
    out: list[tuple[int, ...]] = []
    current: list[int] = []
    for i in target:
        if i == space:
            if current:
                out.append(tuple(current))
            current = []
        else:
            current.append(i)
    return out + ([tuple(current)] if current else [])


def align(source: list[int], target: list[tuple[int, ...]], cost: dict[Unit, float], unseen: float) -> list[Unit]:
    """The cheapest cut of a pair into units (each unit's cost from `cost`, `unseen` for one not in it); [] where no
    cut into SHAPES exists."""
    S, T = len(source), len(target)
    best = [[math.inf] * (T + 1) for _ in range(S + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (T + 1) for _ in range(S + 1)]
    best[0][0] = 0.0
    for i in range(S + 1):
        for j in range(T + 1):
            for g, p in SHAPES:
                if g <= i and p <= j and best[i - g][j - p] < math.inf:
                    unit = (tuple(source[i - g : i]), tuple(target[j - p : j]))
                    total = best[i - g][j - p] + cost.get(unit, unseen)
                    if total < best[i][j]:
                        best[i][j], back[i][j] = total, (g, p)
    if best[S][T] == math.inf:
        return []
    units: list[Unit] = []
    i, j = S, T
    while i or j:
        g, p = back[i][j] or (0, 0)
        units.append((tuple(source[i - g : i]), tuple(target[j - p : j])))
        i, j = i - g, j - p
    return units[::-1]


def alignments(pairs: list[tuple[list[int], list[tuple[int, ...]]]]) -> list[list[Unit]]:
    """Each pair cut into units: ROUNDS of EM over every cut of every pair (forward-backward: each unit's expected
    count under the probabilities of the round before), then each pair's most likely cut. The first round's
    probabilities favour one letter to one sound; a unit the counts never reached costs UNSEEN."""
    weight: Callable[[Unit], float] = prior
    prob: dict[Unit, float] = {}
    for _ in range(ROUNDS):
        counts: defaultdict[Unit, float] = defaultdict(float)
        for source, target in pairs:
            expected_counts(source, target, weight, counts)
        total = sum(counts.values()) or 1.0
        prob = {unit: n / total for unit, n in counts.items() if n > 1e-6}
        weight = looked_up(prob)
    cost = {unit: -math.log(p) for unit, p in prob.items()}
    return [align(s, t, cost, UNSEEN) for s, t in pairs]


def looked_up(prob: dict[Unit, float]) -> Callable[[Unit], float]:
    """A round's weights: each unit's probability from the counts before it (0 for one they never reached)."""
    return lambda unit: prob.get(unit, 0.0)


def prior(unit: Unit) -> float:
    """The first round's weight of a unit, by its shape: one letter to one sound the likeliest."""
    return 1.0 if len(unit[0]) == len(unit[1]) == 1 else 0.1


def expected_counts(
    source: list[int], target: list[tuple[int, ...]], prob: Callable[[Unit], float], counts: defaultdict[Unit, float]
) -> None:
    """Add each unit's expected count in the cuts of one pair, each cut weighted by its units' product of `prob`."""
    S, T = len(source), len(target)

    def unit(i: int, j: int, g: int, p: int) -> Unit:
        return tuple(source[i : i + g]), tuple(target[j : j + p])

    def steps(i: int, j: int) -> list[tuple[int, int, float]]:
        """The units that start at (i, j) and fit: their shapes and weights."""
        fits = [(g, p) for g, p in SHAPES if i + g <= S and j + p <= T]
        return [(g, p, prob(unit(i, j, g, p))) for g, p in fits]

    forward = [[0.0] * (T + 1) for _ in range(S + 1)]
    forward[0][0] = 1.0
    for i in range(S + 1):
        for j in range(T + 1):
            if forward[i][j]:
                for g, p, w in steps(i, j):
                    forward[i + g][j + p] += forward[i][j] * w
    backward = [[0.0] * (T + 1) for _ in range(S + 1)]
    backward[S][T] = 1.0
    for i in range(S, -1, -1):
        for j in range(T, -1, -1):
            if (i, j) != (S, T):
                backward[i][j] = sum(w * backward[i + g][j + p] for g, p, w in steps(i, j))
    whole = forward[S][T]
    if whole <= 0.0:
        return
    for i in range(S + 1):
        for j in range(T + 1):
            if forward[i][j]:
                for g, p, w in steps(i, j):
                    if share := forward[i][j] * w * backward[i + g][j + p] / whole:
                        counts[unit(i, j, g, p)] += share


def recombined(train: list[Pair], space: int | None, count: int, seed: int, longest: int) -> list[Pair]:
    """`count` synthetic pairs (fewer where the units allow fewer), none longer than `longest` ids on either side nor
    equal to a training pair, the same for the same pairs and seed (a resumed run, every DDP rank)."""
    if count == 0:
        return []
    spaced = space if space is not None and any(space in t for _, t in train) else None  # phones, or characters
    split = [(list(s), tokens(list(t), spaced)) for s, t in train]
    aligned = [units for units in alignments(split) if len(units) >= 2]
    where: dict[Unit, list[tuple[int, int]]] = {}  # each sounded unit: the words and places it is found at
    for w, units in enumerate(aligned):
        for k, unit in enumerate(units):
            if unit[1]:
                where.setdefault(unit, []).append((w, k))
    heads = [(w, k) for w, units in enumerate(aligned) for k in range(1, len(units)) if units[k][1]]
    if not heads:
        return []
    rng = random.Random(seed)
    known = {(tuple(s), tuple(t)) for s, t in train}
    made: list[Pair] = []
    for _ in range(4 * count):  # some draws give a word already known or too long: tries are bounded
        if len(made) == count:
            break
        w, k = heads[rng.randrange(len(heads))]
        v, m = rng.choice(where[aligned[w][k]])
        units = aligned[w][:k] + aligned[v][m:]
        source = [i for unit in units for i in unit[0]]
        target = joined([token for unit in units for token in unit[1]], spaced)
        fits = source and max(len(source), len(target)) <= longest
        if fits and v != w and (tuple(source), tuple(target)) not in known:
            made.append((source, target))
    return made


def joined(target: list[tuple[int, ...]], space: int | None) -> list[int]:
    """Tokens back into target ids: space-separated where the target had spaces."""
    out: list[int] = []
    for n, token in enumerate(target):
        if n and space is not None:
            out.append(space)
        out.extend(token)
    return out
