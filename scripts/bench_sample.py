"""Sampling speed of a model of configs/gpu.yaml's size (6 x 384, context 256): float32 against int8 weights, this
code against an earlier commit's, and how often int8 picks the same next character as float32.

    python scripts/bench_sample.py                              # prints figures
    python scripts/bench_sample.py --against HEAD~1             # also the same runs with an earlier commit's code
    python scripts/bench_sample.py --checkpoint runs/gpu        # also int8's top-1 agreement on a trained model
    python scripts/bench_sample.py --model runs/cpu --rounds 2  # time a trained model instead (the default one here)
    python scripts/bench_sample.py --record                     # and appends them to docs/benchmarks.md

Every timed run is a fresh process sampling 1,000 new characters from a one-character prompt with seed 0 from the
same randomly initialised model (torch.manual_seed(0)) or the --model checkpoint, so runs differ only in the code
and the precision; rounds
alternate the variants (this machine's speed drifts). A run prints its text's hash: float32 here and at --against
must agree (the same text for the same seed). The reference path without the cache is timed once per precision.

The agreement run (--checkpoint) teacher-forces the checkpoint's validation text through the cached decoder
(--agreement-steps characters), once with float32 and once with int8 weights, and counts the steps where the two
rank the same character first; it also reports each precision's loss over those characters.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# One timed run in a fresh process, importing charlm from the tree on sys.argv[1]; only API both trees share.
CHILD = r"""
import hashlib, json, sys, torch
sys.path.insert(0, sys.argv[1])
from charlm.config import load_config
from charlm.generate import SampleOptions, sample
from charlm.model import GPT
from charlm.tokenizer import CharTokenizer
precision, batch, tokens, cached, checkpoint = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
if checkpoint:
    from charlm.api import load
    loaded = load(checkpoint, "cpu")
    model, tokenizer = loaded.decoder, loaded.tokenizer
else:
    config = load_config("gpu")
    config.model.dropout = 0.0
    tokenizer = CharTokenizer(["\n"] + [chr(c) for c in range(32, 96)])
    torch.manual_seed(0)
    model = GPT(config.model, tokenizer.vocab_size).eval()
if precision == "int8":
    from charlm.quantize import for_decoding
    model = for_decoding(model, "int8")
options = SampleOptions(max_new_tokens=tokens, temperature=1.0, seed=0, num_samples=batch, use_cache=cached == "1")
sample(model, tokenizer, tokenizer.encode("\n"), SampleOptions(max_new_tokens=20, seed=1, num_samples=batch))
result = sample(model, tokenizer, tokenizer.encode("\n"), options)
digest = hashlib.sha256("\x00".join(result.samples).encode()).hexdigest()[:12]
print(json.dumps({"chars_per_s": result.chars_per_s, "text": digest}))
"""


def timed_run(tree: Path, precision: str, batch: int, tokens: int, cached: bool = True, model: str = "") -> dict:
    args = [sys.executable, "-c", CHILD, str(tree), precision, str(batch), str(tokens), "1" if cached else "0",
            str(Path(model).resolve()) if model else ""]  # fmt: skip
    result = subprocess.run(args, capture_output=True, text=True, cwd=tree)
    if result.returncode != 0:
        raise SystemExit(f"a timed run failed ({precision}, batch {batch}, code {tree}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def checkout(rev: str, into: Path) -> Path:
    """The files of commit `rev` (git archive), unpacked under `into`."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def agreement(checkpoint: str, steps: int) -> dict:
    """Teacher-force `steps` validation characters through float32 and int8 decoders; top-1 agreement and losses."""
    from charlm.api import load
    from charlm.data import Corpus
    from charlm.generate import teacher_forced

    firsts: dict[str, list[int]] = {}
    losses: dict[str, float] = {}
    for precision in ("float32", "int8"):
        model = load(checkpoint, "cpu", precision)
        text = Corpus.from_config(model.config.data, model.tokenizer, "error").split("val")[: steps + 1].long()
        if len(text) < steps + 1:
            raise SystemExit(f"the validation split has {len(text)} characters, fewer than {steps + 1}")
        firsts[precision], losses[precision] = teacher_forced(model.decoder, text)
    same = sum(a == b for a, b in zip(firsts["float32"], firsts["int8"], strict=True))
    return {"steps": steps, "same": same, "loss_float32": losses["float32"], "loss_int8": losses["int8"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--uncached-tokens", type=int, default=200, help="new characters for the reference path")
    parser.add_argument("--rounds", type=int, default=3, help="0: no timing (the agreement run only)")
    parser.add_argument("--against", help="an earlier commit to time beside this code (e.g. HEAD~1)")
    parser.add_argument("--checkpoint", help="a trained decoder (run folder or file) for the agreement run")
    parser.add_argument("--model", help="time this trained decoder (run folder or file) instead of a random 6 x 384")
    parser.add_argument("--agreement-steps", type=int, default=10_000)
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.md")
    args = parser.parse_args()

    from benchlib import append_section

    with tempfile.TemporaryDirectory() as tmp:
        variants = [("this code", ROOT, "float32"), ("this code", ROOT, "int8")]
        if args.against:
            sha = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.strip()  # fmt: skip
            variants.insert(0, (f"commit {sha}", checkout(args.against, Path(tmp)), "float32"))
        rows: list[list[str]] = []
        for batch in (1, 8):
            rates: dict[tuple[str, str], list[float]] = {}
            texts: dict[tuple[str, str], set[str]] = {}
            for round_ in range(args.rounds):
                for name, tree, precision in variants:
                    run = timed_run(tree, precision, batch, args.tokens, model=args.model or "")
                    rates.setdefault((name, precision), []).append(run["chars_per_s"])
                    texts.setdefault((name, precision), set()).add(run["text"])
                    print(f"batch {batch} round {round_ + 1}: {name:15s} {precision:8s} {run['chars_per_s']:8.1f} "
                          f"chars/s  text {run['text']}", flush=True)  # fmt: skip
            for (name, precision), values in rates.items():
                each = " / ".join(f"{v:,.0f}" for v in values)
                text = ", ".join(sorted(texts[(name, precision)]))
                rows.append([name, precision, str(batch), "KV cache", f"**{statistics.median(values):,.0f}** ({each})",
                             text])  # fmt: skip
        for precision in ("float32", "int8") if args.rounds else ():
            run = timed_run(ROOT, precision, 1, args.uncached_tokens, cached=False, model=args.model or "")
            print(f"batch 1 no cache: {precision} {run['chars_per_s']:.1f} chars/s")
            rate = f"{run['chars_per_s']:,.0f}"
            rows.append(["this code", precision, "1", "no cache (reference)", rate, run["text"]])
    header = ["code", "weights", "batch", "path", "chars/s: median (each round)", "text (hash)"]
    if args.record and rows:
        append_section(f"Sampling speed: {args.model or '6 layers x 384, context 256'}", header, rows)
    if args.checkpoint:
        found = agreement(args.checkpoint, args.agreement_steps)
        share = found["same"] / found["steps"]
        print(f"int8 against float32 on {args.checkpoint}: the same first choice at {found['same']:,} of "
              f"{found['steps']:,} steps ({share:.2%}); loss {found['loss_float32']:.4f} (float32), "
              f"{found['loss_int8']:.4f} (int8) nats/char")  # fmt: skip
        if args.record:
            append_section(
                "int8 decoding against float32: next-character agreement",
                ["checkpoint", "steps", "same first choice", "loss float32", "loss int8"],
                [[args.checkpoint, f"{found['steps']:,}", f"{found['same']:,} ({share:.2%})",
                  f"{found['loss_float32']:.4f}", f"{found['loss_int8']:.4f}"]],
            )  # fmt: skip


if __name__ == "__main__":
    main()
