"""Benchmark: does fine-tuning pay? A model trained on the first half of tiny-shakespeare, then 30 s on the second
half with --init-from, against the same model untouched and against a fresh 30 s run on the second half — all scored
on the second half's validation split, in one invocation.

    python scripts/finetune_demo.py                  # data/tinyshakespeare.txt, as `charlm download` writes it
    python scripts/finetune_demo.py --corpus FILE    # any other text
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def charlm(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "charlm", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"charlm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/tinyshakespeare.txt"))
    parser.add_argument("--work", type=Path, default=Path("runs/finetune-demo"))
    parser.add_argument("--source-seconds", type=float, default=90.0, help="training on the first half")
    parser.add_argument("--seconds", type=float, default=30.0, help="fine-tuning, and the fresh run, on the second")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    text = args.corpus.read_text(encoding="utf-8")
    first, second = args.work / "first-half.txt", args.work / "second-half.txt"
    first.write_text(text[: len(text) // 2], encoding="utf-8")
    second.write_text(text[len(text) // 2 :], encoding="utf-8")
    budget = ["--set", "train.max_steps=0"]
    source = charlm(
        "train",
        "--data",
        str(first),
        "--out-dir",
        str(args.work / "source"),
        "--overwrite",
        "--max-seconds",
        str(args.source_seconds),
        *budget,
    )
    print(f"source: {source['steps']} steps on the first half, its own val {source['full_val_loss']:.4f}")
    untouched = charlm("eval", str(args.work / "source"), "--data", str(second), "--split", "val", "--unknown", "skip")
    tuned = charlm(
        "train",
        "--data",
        str(second),
        "--out-dir",
        str(args.work / "tuned"),
        "--overwrite",
        "--init-from",
        str(args.work / "source"),
        "--extend-vocab",
        "--max-seconds",
        str(args.seconds),
        *budget,
    )
    fresh = charlm(
        "train",
        "--data",
        str(second),
        "--out-dir",
        str(args.work / "fresh"),
        "--overwrite",
        "--max-seconds",
        str(args.seconds),
        *budget,
    )
    print(f"second half's validation split ({tuned['full_val_tokens']:,} characters), nats/char:")
    print(f"  untouched model (first half only)   {untouched['loss']:.4f}  (characters it never saw skipped)")
    print(
        f"  fresh run, {args.seconds:.0f} s                    {fresh['full_val_loss']:.4f}  ({fresh['steps']} steps)"
    )
    print(
        f"  fine-tuned, {args.seconds:.0f} s (--init-from)      {tuned['full_val_loss']:.4f}  ({tuned['steps']} steps)"
    )


if __name__ == "__main__":
    main()
