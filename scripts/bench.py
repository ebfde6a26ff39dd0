"""Benchmark harness: training speed, achieved FLOP/s against the machine's matmul peak, time to a loss, memory,
and sampling speed, for one config, through the real CLI.

    python scripts/bench.py --config cpu --data data/tinyshakespeare.txt --target-loss 1.65 --record
    python scripts/bench.py --config tiny --data ... --set model.n_layer=4 --set train.max_steps=600 --record
    python scripts/bench.py --default-recipe --data data/tinyshakespeare.txt --record

--default-recipe runs plain `charlm train` (configs/cpu.yaml) three times (seeds 1337-1339) and prints each run's
full-validation loss and wall time with their median / min / max, then nanoGPT's CPU shape (4 x 128, context 64,
batch 12, 600 steps) for tokens/s, all in one invocation.

It runs `charlm train --json` (start-up, compilation and evaluation included in the wall time, as a user waits for
them), reads its steady-state tokens/s (training steps only; compile time is reported apart), multiplies by
`charlm info`'s training FLOPs per token, and compares with the peak of a large torch matmul measured here in fp32
and bf16. Time to target is the first periodic evaluation at or under --target-loss (metrics.jsonl's elapsed_s);
the final figure is the full validation pass of best.pt. Peak memory is the training process's RSS on CPU, or
torch's max allocated memory on a GPU. Sampling speed is `charlm sample best.pt --json`'s chars_per_s at batch 1.
With --record, one row goes to docs/benchmarks.md with the date, machine, torch version and this command.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import NANOGPT_SHAPE, append_section, run_charlm, set_args


def matmul_peak(dtype: torch.dtype, device: str, n: int = 2048, seconds: float = 2.0) -> float:
    """FLOP/s of a large square matmul, the best this machine does for this dtype."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2 * n**3 * count / (time.perf_counter() - start)


def charlm(*args: str) -> dict:
    return run_charlm(*args)[0]


def default_recipe(data: str, record: bool) -> None:
    """Three seeds of the default run, then the nanoGPT-shape throughput."""
    from recipes import run_recipes, summarize

    recipe = [("default", [])]
    rows = run_recipes("cpu", data, [1337, 1338, 1339], recipe)
    s = summarize(rows, recipe)[0]
    with tempfile.TemporaryDirectory() as tmp:
        shape = charlm(
            "train",
            "--config",
            "tiny",
            "--data",
            data,
            "--out-dir",
            str(Path(tmp) / "shape"),
            *set_args(NANOGPT_SHAPE),
        )
    print(
        f"\nfull-val median {s['median']:.4f}  min {s['min']:.4f}  max {s['max']:.4f}  "
        f"(spread {s['max'] - s['min']:.4f});  wall median {s['wall_median']:.1f} s, max {s['wall_max']:.1f} s"
    )
    print(f"nanoGPT CPU shape: {shape['tokens_per_s']:,.0f} tokens/s")
    if record:
        append_section(
            "Default recipe, three seeds (`charlm train`)",
            ["seed", "full-val loss", "wall s", "steps", "tokens/s"],
            [
                [str(r["seed"]), f"{r['loss']:.4f}", f"{r['wall']:.1f}", f"{r['steps']:,}", f"{r['tokens_per_s']:,.0f}"]
                for r in rows
            ]
            + [
                [
                    "**median / min / max**",
                    f"**{s['median']:.4f}** / {s['min']:.4f} / {s['max']:.4f}",
                    f"{s['wall_median']:.1f} / max {s['wall_max']:.1f}",
                    "",
                    "",
                ],
                ["nanoGPT CPU shape, 600 steps", "", "", "600", f"{shape['tokens_per_s']:,.0f}"],
            ],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cpu")
    parser.add_argument("--data", required=True)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--target-loss", type=float, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--default-recipe", action="store_true", help="three seeds of plain `charlm train`")
    args = parser.parse_args()
    if args.default_recipe:
        default_recipe(args.data, args.record)
        return

    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    peaks = {name: matmul_peak(dtype, device) for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    print(f"matmul peak on {device}: fp32 {peaks['fp32'] / 1e9:,.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:,.0f} GFLOP/s")

    sets = set_args(args.sets)
    info = charlm("info", "--config", args.config, *sets)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        started = time.perf_counter()
        summary = charlm(
            "train",
            "--config",
            args.config,
            "--data",
            args.data,
            "--out-dir",
            str(run),
            "--device",
            args.device,
            *sets,
        )
        wall = time.perf_counter() - started
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        sampled = charlm(
            "sample", str(run / "best.pt"), "--max-new-tokens", "500", "--seed", "0", "--device", args.device
        )
    flops = summary["tokens_per_s"] * info["flops_per_token"]
    reached = next((m for m in metrics if args.target_loss and m["val_loss"] <= args.target_loss), None)
    figures = {
        "wall_s": wall,
        "tokens_per_s": summary["tokens_per_s"],
        "compile_s": summary["compile_s"],
        "tflops": flops / 1e12,
        "of_fp32_peak": flops / peaks["fp32"],
        "of_bf16_peak": flops / peaks["bf16"],
        "full_val_loss": summary["full_val_loss"],
        "steps": summary["steps"],
        "time_to_target_s": reached["elapsed_s"] if reached else None,
        "peak_memory_mb": summary["peak_memory_mb"],
        "sample_chars_per_s": sampled["chars_per_s"],
    }
    print(json.dumps(figures, indent=2))
    if args.record:
        target = (
            f"{figures['time_to_target_s']:.1f} s to ≤ {args.target_loss}"
            if reached
            else f"not reached (≤ {args.target_loss})"
            if args.target_loss
            else "–"
        )
        append_section(
            f"Training: {args.config} {' '.join(args.sets)}".strip(),
            [
                "wall s (all)",
                "tokens/s",
                "compile s",
                "achieved GFLOP/s",
                "of fp32 / bf16 peak",
                "full-val loss",
                "steps",
                "time to target",
                "peak memory MB",
                "sample chars/s",
            ],
            [
                [
                    f"{wall:.1f}",
                    f"{figures['tokens_per_s']:,.0f}",
                    f"{figures['compile_s']:.1f}",
                    f"{flops / 1e9:,.1f}",
                    f"{figures['of_fp32_peak']:.0%} / {figures['of_bf16_peak']:.0%}",
                    f"{figures['full_val_loss']:.4f}",
                    f"{figures['steps']:,}",
                    target,
                    f"{figures['peak_memory_mb']:,.0f}",
                    f"{figures['sample_chars_per_s']:,.0f}",
                ]
            ],
        )


if __name__ == "__main__":
    main()
