"""Measure small-data recipes for inflection on a SIGMORPHON 2023 language, the arms in one invocation (seeds
alternating): data hallucination (data.hallucinate, which configs/inflection.yaml holds) and best.pt chosen by
accuracy (train.best_by), on the first --items training items. best.pt is chosen on a tenth of those items, so that
the task's dev file, which scores every arm, stays unseen.

    git clone https://github.com/sigmorphon/2023InflectionST data/2023InflectionST
    python scripts/bench_inflection_recipes.py --repo data/2023InflectionST --language heb --items 1000 --seconds 120
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import append_section, run_charlm

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "no hallucination": ["data.hallucinate=0"],
    "hallucinate 10,000 (the config's)": [],
    "hallucinate 10,000, best_by accuracy": ["train.best_by=accuracy"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a clone of sigmorphon/2023InflectionST")
    parser.add_argument("--language", default="heb")
    parser.add_argument("--items", type=int, default=1000, help="the first this many training items")
    parser.add_argument("--seconds", type=float, default=120.0, help="training seconds per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "inflection-recipes")
    parser.add_argument("--record", metavar="TITLE", help="append the table to docs/benchmarks.md")
    args = parser.parse_args()
    data = args.repo / "part1" / "data"
    if not (data / f"{args.language}.trn").is_file():
        raise SystemExit(f"{data / args.language}.trn not found: is --repo a clone of sigmorphon/2023InflectionST?")
    args.out.mkdir(parents=True, exist_ok=True)
    train = args.out / f"{args.language}-{args.items}.trn"
    lines = (data / f"{args.language}.trn").read_text(encoding="utf-8").splitlines(keepends=True)
    train.write_text("".join(lines[: args.items]), encoding="utf-8")
    dev = data / f"{args.language}.dev"
    scores: dict[str, list[float]] = {arm: [] for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:  # alternating: every arm meets the machine as it is at that seed
            run = args.out / f"{args.language}-{list(ARMS).index(arm)}-{seed}"
            sets = ["data.val_fraction=0.1", *ARMS[arm]]  # best.pt on a tenth of the items
            run_charlm(
                "train", "--config", str(ROOT / "configs" / "inflection.yaml"), "--data", str(train), "--out-dir",
                str(run), "--overwrite", "--seed", str(seed), "--max-seconds", str(args.seconds),
                *(x for item in sets for x in ("--set", item)),
            )  # fmt: skip
            scored, _ = run_charlm("eval", str(run), "--data", str(dev), "--split", "all")
            scores[arm].append(100 * scored["exact_match"])
            print(f"{arm}, seed {seed}: dev accuracy {scores[arm][-1]:.2f}%", flush=True)
    header = ["recipe", f"{args.language} dev accuracy % (median)", "per seed", "training items", "seconds"]
    size = [f"{args.items:,}", f"{args.seconds:.0f}"]
    rows = [[arm, f"{statistics.median(s):.2f}", " / ".join(f"{x:.2f}" for x in s), *size] for arm, s in scores.items()]
    for row in [header, *rows]:
        print("  ".join(row))
    if args.record:
        append_section(args.record, header, rows)


if __name__ == "__main__":
    main()
