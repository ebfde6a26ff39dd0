"""CMUdict's train, dev and test words as three TSV files, the split configs/g2p.yaml makes, and a smaller training
sample of whole words for the small-data recipe.

    charlm download cmudict
    python scripts/cmudict_splits.py                      # data/cmudict-splits/{train,dev,test}.tsv, train-10k.tsv
    charlm train --config g2p-small                       # 10,000 training words, the same dev and test words

The split is charlm's own: data/cmudict.tsv read as configs/g2p.yaml reads it (a word's pronunciations kept
together, 12,000 test words and 6,000 dev words by the seeded word shuffle), so `charlm eval RUN --split test` of a
run on the full file and of a run on these files score the same 12,000 words. The sample is --train-words words
drawn with --seed from the training words, every pronunciation of each drawn word kept.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from charlm.config.build import load_config  # noqa: E402
from charlm.data.pairs import Pair, PairCorpus  # noqa: E402
from charlm.files import atomic_write  # noqa: E402


def write_pairs(path: Path, pairs: list[Pair], decode) -> int:
    """`source<TAB>target` lines, a word's lines together in the order read; returns the distinct words."""
    text = "".join(f"{decode(s)}\t{decode(t)}\n" for s, t in pairs)
    atomic_write(path, lambda f: f.write(text.encode()))
    return len({tuple(s) for s, _ in pairs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/cmudict.tsv", help="the TSV `charlm download cmudict` wrote")
    parser.add_argument("--out", type=Path, default=Path("data/cmudict-splits"), help="folder for the files")
    parser.add_argument("--train-words", type=int, default=10_000, help="words in the smaller training sample")
    parser.add_argument("--seed", type=int, default=0, help="which words the sample draws")
    args = parser.parse_args()
    config = load_config("g2p", [f"data.path={args.data}"])
    corpus = PairCorpus.from_config(config.data, config.model.block_size, say=print)
    decode = corpus.tokenizer.decode
    args.out.mkdir(parents=True, exist_ok=True)
    for name, pairs in (("train", corpus.train), ("dev", corpus.val), ("test", corpus.test)):
        words = write_pairs(args.out / f"{name}.tsv", pairs, decode)
        print(f"{args.out / f'{name}.tsv'}: {words:,} words, {len(pairs):,} pronunciations")
    by_word: dict[tuple[int, ...], list[Pair]] = {}
    for pair in corpus.train:
        by_word.setdefault(tuple(pair[0]), []).append(pair)
    if not 0 < args.train_words <= len(by_word):
        raise SystemExit(f"--train-words must be between 1 and the {len(by_word):,} training words")
    drawn = random.Random(args.seed).sample(sorted(by_word), args.train_words)
    sample = [pair for word in drawn for pair in by_word[word]]
    name = f"train-{args.train_words // 1000}k.tsv" if args.train_words % 1000 == 0 else f"train-{args.train_words}.tsv"
    words = write_pairs(args.out / name, sample, decode)
    print(f"{args.out / name}: {words:,} words, {len(sample):,} pronunciations (seed {args.seed})")


if __name__ == "__main__":
    main()
