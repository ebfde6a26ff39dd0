"""Training throughput of several commits at nanoGPT's CPU shape, alternating commit by commit in one invocation: to
find which commit changed the speed (docs/benchmarks.md, "Training throughput by commit").

    python scripts/bisect_throughput.py --data data/tinyshakespeare.txt --revs 64469ce 52063d3 8102dcf HEAD
    python scripts/bisect_throughput.py --data data/tinyshakespeare.txt --revs 64469ce HEAD --rounds 4 --record

Each commit's files are unpacked with `git archive`; every run is a fresh `python -m charlm train` of that tree on
the same shape, seed and data (`--config tiny` with scripts/benchlib.py's NANOGPT_SHAPE), and rounds take the
commits in turn so that this machine's drift falls on all of them alike. It prints and records each commit's
tokens/s per round and their median, and the final validation loss, which must be the same for commits whose
arithmetic is the same.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_sample import checkout  # noqa: E402  (after the path above)
from benchlib import NANOGPT_SHAPE, append_section, run_charlm, set_args  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="tiny-shakespeare (any text works; keep it fixed)")
    parser.add_argument("--revs", nargs="+", required=True, help="commits to compare, oldest first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600, help="training steps per run (nanoGPT's shape: 600)")
    parser.add_argument("--record", action="store_true", help="append the table to docs/benchmarks.md")
    args = parser.parse_args()
    data = args.data.resolve()
    if not data.is_file():
        raise SystemExit(f"--data {args.data}: no such file")

    shape = [*set_args([*NANOGPT_SHAPE, f"train.max_steps={args.steps}"]), "--config", "tiny"]
    rates: dict[str, list[float]] = {}
    losses: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for rev in args.revs:
            sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.strip()  # fmt: skip
            trees[sha] = checkout(rev, Path(tmp) / sha)
        for round_ in range(args.rounds):
            for sha, tree in trees.items():
                out = Path(tmp) / f"run-{sha}-{round_}"
                summary, wall = run_charlm("train", *shape, "--data", str(data), "--out-dir", str(out), cwd=tree)
                rate, loss = summary["tokens_per_s"], summary["full_val_loss"]
                print(f"round {round_ + 1}: {sha} {rate:9,.0f} tokens/s  full val {loss:.4f}  ({wall:.1f} s)")
                rates.setdefault(sha, []).append(rate)
                losses.setdefault(sha, set()).add(f"{loss:.4f}")
    first = statistics.median(rates[next(iter(rates))])
    rows = []
    for sha, values in rates.items():
        median = statistics.median(values)
        each = " / ".join(f"{v:,.0f}" for v in values)
        rows.append([sha, f"**{median:,.0f}** ({each})", f"{median / first:.3f}", ", ".join(sorted(losses[sha]))])
        print(f"{sha}: median {median:,.0f} tokens/s ({median / first:.3f}x the first)")
    if args.record:
        header = ["commit", "tokens/s: median (each round)", "median / first commit's", "full-val loss"]
        append_section(
            "Training throughput by commit, nanoGPT's CPU shape (scripts/bisect_throughput.py)", header, rows
        )


if __name__ == "__main__":
    main()
