"""Benchmark: training and evaluating on a corpus of any size — preparation speed, time to the first step, and the
peak resident memory of each `charlm` process (torch included).

    python scripts/bench_big_corpus.py --data BIG.txt                 # a text you have (e.g. the kernel sources)
    python scripts/bench_big_corpus.py --make-mb 1000 --data big.txt  # tiny-shakespeare (`charlm download`) repeated
    python scripts/bench_big_corpus.py --data kernel.txt --eval       # e.g. the Linux kernel's C sources, concatenated

Runs, each in a fresh process: (1) `charlm train --config tiny --data BIG --set train.max_steps=20` with no
prepared file (it prepares the corpus), (2) the same again (it maps the prepared file), (3) with --eval,
`charlm eval RUN --split val` (the whole validation split). Prints one line per run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

RSS_CHILD = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)"
)


def run_measured(args: list[str]) -> tuple[float, float, str, str]:
    """(wall seconds, peak RSS in MB, stdout, stderr) of `charlm ARGS` in its own process."""
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, sys.executable, "-m", "charlm", *args], capture_output=True, text=True
    )
    wall = time.time() - started
    if proc.returncode != 0:
        sys.exit(f"charlm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    *rest, rss_kb = proc.stderr.strip().splitlines()
    return wall, int(rss_kb) / 1024, proc.stdout, "\n".join(rest)


def first_step_after(run_dir: Path, started: float) -> float:
    first = json.loads((run_dir / "steps.jsonl").read_text().splitlines()[0])
    return first["time"] - started


def make_text(dest: Path, source: Path, megabytes: int) -> None:
    piece = source.read_bytes()
    with open(dest, "wb") as f:
        written = 0
        while written < megabytes * 1_000_000:
            f.write(piece)
            written += len(piece)
    print(f"wrote {dest}: {dest.stat().st_size:,} bytes ({source.name} repeated)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the big text (made first with --make-mb)")
    parser.add_argument("--make-mb", type=int, default=0, help="write --data as --from repeated to this many MB")
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=Path("data/tinyshakespeare.txt"),
        help="the text --make-mb repeats (default: what `charlm download` writes)",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("runs/bench-big"))
    parser.add_argument("--tokenizer", choices=["char", "byte"], default="char")
    parser.add_argument("--eval", action="store_true", help="also time `charlm eval RUN --split val`")
    args = parser.parse_args()
    if args.make_mb:
        make_text(args.data, args.source, args.make_mb)
    size_mb = args.data.stat().st_size / 1e6
    for stale in args.data.parent.glob(f".{args.data.name}.{args.tokenizer}-tokens.*"):
        stale.unlink()  # run 1 prepares from scratch
    train = [
        "train",
        "--config",
        "tiny",
        "--data",
        str(args.data),
        "--set",
        "train.max_steps=20",
        "--set",
        f"data.tokenizer={args.tokenizer}",
        "--set",
        "train.log_interval=1",
        "--out-dir",
        str(args.out_dir),
        "--overwrite",
        "--json",
    ]
    print(f"corpus {args.data.name}: {size_mb:,.1f} MB, tokenizer {args.tokenizer}")
    for label in ("run 1 (prepares)", "run 2 (prepared)"):
        started = time.time()
        wall, rss, out, err = run_measured(train)
        summary = json.loads(out)
        prepared = re.search(r"in ([\d.]+) s \(([\d,]+) MB/s\)", err)
        prep = f", prepared in {prepared.group(1)} s ({prepared.group(2)} MB/s)" if prepared else ""
        print(
            f"{label}: {wall:.1f} s wall, first step {first_step_after(args.out_dir, started):.1f} s after "
            f"starting, peak RSS {rss:,.0f} MB{prep}; {summary['steps']} steps, end-of-run val pass "
            f"{summary['full_val_loss']:.4f} over {summary['full_val_tokens']:,} tokens"
        )
    if args.eval:
        wall, rss, out, _ = run_measured(["eval", str(args.out_dir), "--split", "val", "--batch-size", "256", "--json"])
        result = json.loads(out)
        print(
            f"eval --split val: {wall:.1f} s wall, peak RSS {rss:,.0f} MB; {result['chars']:,} tokens scored, "
            f"loss {result['loss']:.4f}"
        )


if __name__ == "__main__":
    main()
