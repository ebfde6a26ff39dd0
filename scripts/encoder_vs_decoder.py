"""An encoder (masked characters) beside a decoder (next character) trained for the same time on the same text.

    python scripts/encoder_vs_decoder.py                     # tiny-shakespeare at data/, 60 s each, prints figures
    python scripts/encoder_vs_decoder.py --record            # and appends them to docs/benchmarks.md

Both start from the default recipe (configs/cpu.yaml) with `train.max_seconds` set; the encoder adds only
`model.arch=encoder`. Runs alternate (decoder, encoder) in one invocation. The encoder's figure is the share of
hidden characters it restores on the validation split (15% of each window hidden, seeing both sides); the
decoder's is the share of next characters it predicts as its top choice on the same split (seeing only the left
side, in non-overlapping windows of its context). They measure different tasks: a hidden character with context on
both sides is easier to restore than the next one is to predict, so the encoder's figure is expected to be higher.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import append_section, run_charlm, set_args

import charlm
from charlm.data.corpus import Corpus, full_pass_windows


@torch.no_grad()
def next_char_accuracy(run: Path) -> tuple[float, float, int]:
    """A decoder's top-1 accuracy and loss on the next character over its validation split."""
    model = charlm.load(run, "cpu")
    ids = Corpus.from_config(model.config.data, model.tokenizer).val
    right = count = 0
    total = 0.0
    for x, y in full_pass_windows(ids, model.config.model.block_size, 64):
        logits, loss = model.module(x, y)
        right += int((logits.argmax(-1) == y).sum())
        total += float(loss) * y.numel()
        count += y.numel()
    return right / count, total / count, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/tinyshakespeare.txt")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("decoder", "encoder"):
            run = Path(tmp) / arch
            sets = set_args([f"train.max_seconds={args.seconds}", f"model.arch={arch}"])
            summary, wall = run_charlm("train", *sets, "--data", args.data, "--out-dir", str(run))
            if arch == "encoder":
                scored, _ = run_charlm("eval", str(run))
                accuracy, loss, chars = scored["accuracy"], scored["loss"], scored["chars"]
                what = "hidden characters restored (both sides seen)"
            else:
                accuracy, loss, chars = next_char_accuracy(run)
                what = "next characters predicted (left side seen)"
            print(
                f"{arch}: {summary['steps']} steps in {wall:.1f} s; {100 * accuracy:.2f}% of {chars:,} {what}, "
                f"loss {loss:.4f} nats/char",
                flush=True,
            )
            rows.append([arch, str(summary["steps"]), f"{wall:.1f}", what, f"{chars:,}", f"{100 * accuracy:.2f}%",
                         f"{loss:.4f}"])  # fmt: skip
    if args.record:
        header = ["arch", "steps", "wall (s)", "measured", "characters scored", "top-1 accuracy", "loss (nats/char)"]
        append_section(f"Encoder beside decoder, {args.seconds:g} s each on tiny-shakespeare", header, rows)


if __name__ == "__main__":
    main()
