"""Sampling speed of a model of configs/gpu.yaml's size (6 x 384, context 256): float32 against int8 weights, each
eager and with the compiled step (--compile), this code against an earlier commit's, and how often each picks the
same next character as plain float32.

    python scripts/bench_sample.py                              # prints figures
    python scripts/bench_sample.py --against HEAD~1             # also the same runs with an earlier commit's code
    python scripts/bench_sample.py --checkpoint runs/gpu        # also each decoder's top-1 agreement on a trained model
    python scripts/bench_sample.py --model runs/cpu --rounds 2  # time a trained model instead (the default one here)
    python scripts/bench_sample.py --model runs/cpu --beside runs/old  # and another one with this code, alternating
    python scripts/bench_sample.py --record                     # and appends them to docs/benchmarks.md

Every timed run is a fresh process sampling 1,000 new characters from a one-character prompt with seed 0 from the
same randomly initialised model (torch.manual_seed(0)) or the --model checkpoint, so runs differ only in the code,
the precision and the compiled step; rounds alternate the variants (this machine's speed drifts). A compiled run
compiles during a 20-character warm-up, whose compile time is reported on its own (chars/s leaves it out, as
`charlm sample --compile --json` does). A run prints its text's hash: float32 here and at --against must agree (the
same text for the same seed). The reference path without the cache is timed once per precision.

The agreement run (--checkpoint) teacher-forces the checkpoint's validation text through the cached decoder
(--agreement-steps characters) with each decoder (float32 or int8 weights, eager or compiled), and counts the steps
where each ranks the same character first as plain float32; it also reports each decoder's loss over them.
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
try:  # packages by role
    from charlm.config.build import load_config
    from charlm.data.tokenizer import CharTokenizer
    from charlm.decoding.generate import sample
    try:
        from charlm.models.decoder import Decoder as GPT
    except ImportError:  # a tree from before the class took its family's name
        from charlm.models.decoder import GPT
    from charlm import load
    from charlm.models.quantize import for_decoding
    try:
        from charlm.decoding.options import DecodeOptions as SampleOptions
    except ImportError:
        from charlm.decoding.generate import SampleOptions
except ImportError:  # a tree from before them: one flat package
    from charlm.config import load_config
    from charlm.tokenizer import CharTokenizer
    from charlm.generate import SampleOptions, sample
    from charlm.model import GPT
    from charlm.api import load
    from charlm.quantize import for_decoding
precision, batch, tokens, cached, checkpoint = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
compiled = {"compile": True} if sys.argv[7] == "1" else {}  # only this code's SampleOptions has the field
if checkpoint:
    loaded = load(checkpoint, "cpu")
    model, tokenizer = loaded.decoder, loaded.tokenizer
else:
    config = load_config("gpu")
    config.model.dropout = 0.0
    tokenizer = CharTokenizer(["\n"] + [chr(c) for c in range(32, 96)])
    torch.manual_seed(0)
    model = GPT(config.model, tokenizer.vocab_size).eval()
if precision == "int8":
    model = for_decoding(model, "int8")
options = SampleOptions(max_new_tokens=tokens, temperature=1.0, seed=0, num_samples=batch, use_cache=cached == "1",
                        **compiled)
warm = sample(model, tokenizer, tokenizer.encode("\n"), SampleOptions(max_new_tokens=20, seed=1, num_samples=batch,
                                                                     **compiled))
result = sample(model, tokenizer, tokenizer.encode("\n"), options)
digest = hashlib.sha256("\x00".join(result.samples).encode()).hexdigest()[:12]
compile_s = getattr(warm, "compile_seconds", 0.0)
print(json.dumps({"chars_per_s": result.chars_per_s, "text": digest, "compile_s": compile_s}))
"""


def timed_run(tree: Path, precision: str, batch: int, tokens: int, cached: bool = True, model: str = "",
              compiled: bool = False) -> dict:  # fmt: skip
    args = [sys.executable, "-c", CHILD, str(tree), precision, str(batch), str(tokens), "1" if cached else "0",
            str(Path(model).resolve()) if model else "", "1" if compiled else "0"]  # fmt: skip
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


DECODERS = [("float32", False), ("int8", False), ("float32", True), ("int8", True)]  # (weights, compiled step)


def decoder_name(precision: str, compiled: bool) -> str:
    return precision + (", compiled" if compiled else "")


def agreement(checkpoint: str, steps: int) -> list[dict]:
    """Teacher-force `steps` validation characters through each decoder of DECODERS: how often each ranks the same
    character first as the plain float32 decoder, and each one's loss."""
    import torch

    from charlm import load
    from charlm.data.corpus import Corpus
    from charlm.decoding.generate import teacher_forced

    found: list[dict] = []
    text = torch.empty(0)
    for precision, compiled in DECODERS:
        model = load(checkpoint, "cpu", precision)
        if not found:  # the same text for every decoder, read once
            text = Corpus.from_config(model.config.data, model.tokenizer, "error").split("val")[: steps + 1].long()
            if len(text) < steps + 1:
                raise SystemExit(f"the validation split has {len(text)} characters, fewer than {steps + 1}")
        firsts, loss = teacher_forced(model.decoder, text, compile=compiled)
        same = sum(a == b for a, b in zip(found[0]["firsts"] if found else firsts, firsts, strict=True))
        found.append({"decoder": decoder_name(precision, compiled), "firsts": firsts, "same": same, "loss": loss})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--uncached-tokens", type=int, default=200, help="new characters for the reference path")
    parser.add_argument("--rounds", type=int, default=3, help="0: no timing (the agreement run only)")
    parser.add_argument("--against", help="an earlier commit to time beside this code (e.g. HEAD~1)")
    parser.add_argument(
        "--against-decoders",
        default="float32",
        help="which decoders --against times too: float32 (default), or all (int8 and compiled: needs a commit "
        "that has them)",
    )
    parser.add_argument("--checkpoint", help="a trained decoder (run folder or file) for the agreement run")
    parser.add_argument("--model", help="time this trained decoder (run folder or file) instead of a random 6 x 384")
    parser.add_argument("--beside", help="also time this trained decoder (float32) with this code, alternating")
    parser.add_argument("--agreement-steps", type=int, default=10_000)
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.md")
    args = parser.parse_args()

    from benchlib import append_section

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or ""
        variants = [("this code", ROOT, precision, compiled, model) for precision, compiled in DECODERS]
        if args.against:
            sha = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.strip()  # fmt: skip
            old = checkout(args.against, Path(tmp))
            decoders = DECODERS if args.against_decoders == "all" else [("float32", False)]
            earlier = [(f"commit {sha}", old, precision, compiled, model) for precision, compiled in decoders]
            # each decoder's two sides one after the other, so drift between them stays small
            variants = [v for pair in zip(earlier, variants, strict=False) for v in pair] + variants[len(earlier) :]
        if args.beside:
            variants.insert(0, (f"model {args.beside}", ROOT, "float32", False, args.beside))
        rows: list[list[str]] = []
        for batch in (1, 8):
            rates: dict[tuple[str, str], list[float]] = {}
            texts: dict[tuple[str, str], set[str]] = {}
            compiling: dict[tuple[str, str], list[float]] = {}
            for round_ in range(args.rounds):
                for name, tree, precision, compiled, timed_model in variants:
                    run = timed_run(tree, precision, batch, args.tokens, model=timed_model, compiled=compiled)
                    key = (name, decoder_name(precision, compiled))
                    rates.setdefault(key, []).append(run["chars_per_s"])
                    texts.setdefault(key, set()).add(run["text"])
                    compiling.setdefault(key, []).append(run.get("compile_s", 0.0))
                    print(f"batch {batch} round {round_ + 1}: {name:15s} {key[1]:18s} {run['chars_per_s']:8.1f} "
                          f"chars/s  text {run['text']}  compile {compiling[key][-1]:.1f} s", flush=True)  # fmt: skip
            for (name, weights), values in rates.items():
                each = " / ".join(f"{v:,.0f}" for v in values)
                text = ", ".join(sorted(texts[(name, weights)]))
                seconds = statistics.median(compiling[(name, weights)])
                rows.append([name, weights, str(batch), "KV cache", f"**{statistics.median(values):,.0f}** ({each})",
                             f"{seconds:.1f}" if "compiled" in weights else "–", text])  # fmt: skip
        for precision in ("float32", "int8") if args.rounds else ():
            run = timed_run(ROOT, precision, 1, args.uncached_tokens, cached=False, model=args.model or "")
            print(f"batch 1 no cache: {precision} {run['chars_per_s']:.1f} chars/s")
            rate = f"{run['chars_per_s']:,.0f}"
            rows.append(["this code", precision, "1", "no cache (reference)", rate, "–", run["text"]])
    header = ["code", "weights", "batch", "path", "chars/s: median (each round)", "compile s", "text (hash)"]
    if args.record and rows:
        append_section(f"Sampling speed: {args.model or '6 layers x 384, context 256'}", header, rows)
    if args.checkpoint:
        found = agreement(args.checkpoint, args.agreement_steps)
        steps = args.agreement_steps
        table = [[args.checkpoint, row["decoder"], f"{steps:,}", f"{row['same']:,} ({row['same'] / steps:.2%})",
                  f"{row['loss']:.4f}"] for row in found]  # fmt: skip
        for line in table:
            print(f"{line[1]} against float32 on {args.checkpoint}: the same first choice at {line[3]} of {line[2]} "
                  f"steps; loss {line[4]} nats/char")  # fmt: skip
        if args.record:
            append_section(
                "Decoders against plain float32: next-character agreement",
                ["checkpoint", "decoder", "steps", "same first choice as float32", "loss (nats/char)"],
                table,
            )


if __name__ == "__main__":
    main()
