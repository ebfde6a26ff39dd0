"""Sampling speed, KV-cached against the reference path, for a randomly initialised model of configs/gpu.yaml's size.

    python scripts/bench_sample.py                  # prints figures
    python scripts/bench_sample.py --record         # and appends them to docs/benchmarks.md

Batch 1 and batch 8, 1,000 new characters from a one-character prompt, with and without the cache (the uncached
path recomputes the whole window, up to 256 characters, every step; --uncached-tokens shortens it). Finally the plain
CLI, `charlm sample CKPT --max-new-tokens 1000 --json`, is run on a saved checkpoint of the same model, and its own
chars_per_s (generation only, start-up excluded) is reported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import append_section

from charlm.checkpoint import save_checkpoint
from charlm.config import load_config
from charlm.generate import SampleOptions, sample
from charlm.model import GPT
from charlm.tokenizer import CharTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="gpu")
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--uncached-tokens", type=int, default=None, help="default: --tokens")
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.md")
    args = parser.parse_args()

    config = load_config(args.config)
    config.model.dropout = 0.0
    tokenizer = CharTokenizer(["\n"] + [chr(c) for c in range(32, 96)])  # 65 characters, as tiny-shakespeare
    torch.manual_seed(0)
    model = GPT(config.model, tokenizer.vocab_size).eval()
    shape = f"{config.model.n_layer} layers, {config.model.n_embd} wide, context {config.model.block_size}"
    print(f"model: {shape}, {model.num_params() / 1e6:.2f}M parameters, {torch.get_num_threads()} threads")

    rows = []
    for batch in (1, 8):
        for cached, tokens in ((True, args.tokens), (False, args.uncached_tokens or args.tokens)):
            options = SampleOptions(max_new_tokens=tokens, temperature=1.0, seed=0, num_samples=batch, use_cache=cached)
            result = sample(model, tokenizer, tokenizer.encode("\n"), options)
            per_sample = result.chars_per_s / batch
            label = "KV cache" if cached else "no cache (reference)"
            print(
                f"batch {batch}, {label:22s}: {result.chars_per_s:8.1f} chars/s in all, {per_sample:7.1f} per sample "
                f"({tokens} new chars each)"
            )
            rows.append([f"sampling, {shape}", str(batch), label, str(tokens), f"{result.chars_per_s:.1f}"])

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model.pt"
        save_checkpoint(
            ckpt, {"config": config.to_dict(), "vocab": tokenizer.chars, "model": model.state_dict(), "step": 0}
        )
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "charlm",
                "sample",
                str(ckpt),
                "--max-new-tokens",
                str(args.tokens),
                "--seed",
                "0",
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        cli_rate = json.loads(out.stdout)["chars_per_s"]
    print(f"CLI `charlm sample CKPT --max-new-tokens {args.tokens}` at batch 1: {cli_rate:.1f} chars/s")
    rows.append([f"CLI `charlm sample`, {shape}", "1", "KV cache", str(args.tokens), f"{cli_rate:.1f}"])
    if args.record:
        append_section("Sampling speed", ["what", "batch", "path", "new chars", "chars/s (all samples)"], rows)


if __name__ == "__main__":
    main()
