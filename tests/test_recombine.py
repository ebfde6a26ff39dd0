"""Recombination (data.recombine): the learned letters-to-sounds units, synthetic words that keep every spelling rule
of the list, and the settings it refuses."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import assert_one_line_error, run_cli, train_cli
from test_encdec import SHAPE

from charlm.config.build import load_config
from charlm.data.recombine import alignments, recombined, tokens
from charlm.errors import UsageError
from charlm.families.registry import family_for

PAIR_SETS = [s for s in SHAPE if s != "--set"]
# A spelling with a digraph, a silent letter and a letter of two sounds: sh is one sound, h after a vowel none, x two.
SOUNDS = {"sh": ["S"], "a": ["A"], "i": ["I"], "o": ["O"], "p": ["P"], "t": ["T"], "n": ["N"], "x": ["K", "S"]}


def spoken(word: str) -> str:
    """The list's rule: sh -> S, h after a vowel silent, x -> K S, every other letter its capital."""
    out, i = [], 0
    while i < len(word):
        if word.startswith("sh", i):
            out, i = out + ["S"], i + 2
            continue
        if word[i] == "h":
            i += 1
            continue
        out, i = out + SOUNDS[word[i]], i + 1
    return " ".join(out)


def words(n: int, seed: int) -> list[str]:
    r = random.Random(seed)
    made: set[str] = set()
    while len(made) < n:  # consonant-vowel syllables, h only after a vowel
        syllables = [r.choice(["sh", "p", "t", "n", "x"]) + r.choice("aio") + r.choice(["", "h"]) for _ in range(3)]
        made.add("".join(syllables[: r.randint(1, 3)]))
    return sorted(made)


def encoded(pairs: list[tuple[str, str]]) -> tuple[list[tuple[list[int], list[int]]], list[str]]:
    chars = sorted({c for s, t in pairs for c in s + t})
    stoi = {c: i for i, c in enumerate(chars)}
    return [([stoi[c] for c in s], [stoi[c] for c in t]) for s, t in pairs], chars


def test_the_alignment_learns_digraphs_silent_letters_and_two_sound_letters():
    pairs = [(w, spoken(w)) for w in words(300, 0)]
    ids, chars = encoded(pairs)
    space = chars.index(" ")
    cuts = alignments([(s, tokens(t, space)) for s, t in ids])
    units = {
        ("".join(chars[i] for i in letters), " ".join("".join(chars[i] for i in token) for token in sounds))
        for cut in cuts
        for letters, sounds in cut
    }
    assert {("sh", "S"), ("x", "K S"), ("p", "P")} <= units  # each rule one unit
    silent = {unit for unit in units if "h" in unit[0] and unit != ("sh", "S")}
    # the silent h: a unit of its own, or one with the vowel before it, that vowel's sound
    assert silent and all(unit == ("h", "") or (len(unit[0]) == 2 and unit[1] == unit[0][0].upper()) for unit in silent)
    assert not any(letters == "s" for letters, _ in units)  # s is never read without its h


def test_recombined_words_are_new_and_keep_every_rule_on_both_sides():
    pairs = [(w, spoken(w)) for w in words(300, 0)]
    ids, chars = encoded(pairs)
    made = recombined(ids, chars.index(" "), 500, seed=3, longest=30)
    assert len(made) == 500 and made == recombined(ids, chars.index(" "), 500, seed=3, longest=30)
    known = {(tuple(s), tuple(t)) for s, t in ids}
    for source, target in made:
        word = "".join(chars[i] for i in source)
        assert "".join(chars[i] for i in target) == spoken(word)  # cut alike on both sides: the rules still hold
        assert (tuple(source), tuple(target)) not in known and max(len(source), len(target)) <= 30
    assert recombined(ids, chars.index(" "), 0, seed=3, longest=30) == []


def test_recombined_lines_are_training_lines_only(tmp_path):
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text("".join(f"{w}\t{spoken(w)}\n" for w in words(200, 0)))
    dev.write_text("".join(f"{w}\t{spoken(w)}\n" for w in words(220, 1)[:20]))
    sets = [f"data.path={train}", f"data.val_path={dev}", "data.recombine=300"]
    sets += [*PAIR_SETS, "model.block_size=32"]
    config = load_config("tiny", sets)
    family = family_for(config)
    corpus = family.corpus(config, None, lambda _: None, None)
    batches = family.batches(config, corpus, torch.device("cpu"), seed=0)
    real = list(corpus.train)
    assert batches.pairs[: len(real)] == real and len(batches.pairs) == len(real) + 300
    # The dev file is read as it is, and the synthetic lines owe nothing to it (one may spell a dev word: the list's
    # rules make it too), so another dev file gives the same ones.
    without = load_config("tiny", [s for s in sets if s != "data.recombine=300"])
    plain = family.corpus(without, None, lambda _: None, None)
    assert corpus.split("val") == plain.split("val") and len(corpus.split("val")) == 20
    other = load_config("tiny", [s if s != f"data.val_path={dev}" else f"data.val_path={train}" for s in sets])
    again = family.batches(other, family.corpus(other, None, lambda _: None, None), torch.device("cpu"), seed=0)
    assert again.pairs == batches.pairs


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (["data.recombine=10"], "data.recombine (10) joins words of source<TAB>target pairs"),
        ([*PAIR_SETS, "data.columns=source-features-target", "data.recombine=10"], "hallucinate"),
    ],
)
def test_recombination_is_for_pairs_without_features(sets, said):
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_config("tiny", sets)


def test_a_run_with_recombination_trains(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{w}\t{spoken(w)}\n" for w in words(200, 0)))
    sets = {"data.recombine": 200, "model.block_size": 32}
    run_cli(*train_cli(train, tmp_path / "run", steps=3, config=["--config", "tiny", *SHAPE], sets=sets), check=True)
    refused = run_cli(*train_cli(train, tmp_path / "r", steps=3, config=["--config", "tiny"], sets=sets))
    assert_one_line_error(refused, 2, "data.recombine (200) joins words")
