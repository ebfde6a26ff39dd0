"""Where bf16 autocast trains faster than float32 on this CPU: a training step's time at several widths and batch sizes.

    python scripts/bench_bf16.py            # prints the map
    python scripts/bench_bf16.py --record   # and appends it to docs/benchmarks.md

Each cell is a forward and backward pass of the default recipe's model (configs/cpu.yaml: RoPE, SwiGLU, 3 layers) at
that width, on random windows; float32 and bf16 alternate for each cell, median of --steps after two warm-up steps.
float32 runs on the kernels a training run picks here (train.cpu_linear: auto; oneDNN's on an AMD CPU, since
2026-11-23), so the map compares bf16 with the float32 a user would otherwise get.
charlm.hardware.device.cpu_bf16_pays has the rules drawn from this map on two AMX-BF16 CPUs and an AVX-512 BF16
CPU; the last column says what it picks on this one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import append_section

from charlm.config.build import load_config
from charlm.hardware.device import cpu_bf16_pays, cpu_bf16_units
from charlm.models.decoder import Decoder
from charlm.models.linear import onednn_linears, use_onednn

ONEDNN = use_onednn(torch.device("cpu"), "auto")  # float32's kernels, as `charlm train` picks them here
WIDTHS = (96, 128, 192, 256, 384)
BATCHES = ((12, 64), (16, 128), (32, 128), (64, 128))  # (batch, context): 768 to 8,192 tokens a step


def step_seconds(width: int, batch: int, context: int, bf16: bool, steps: int) -> float:
    sets = [f"model.n_embd={width}", f"model.n_head={max(1, width // 32)}", f"model.block_size={context}"]
    config = load_config("cpu", [*sets, "model.dropout=0.0"])
    torch.manual_seed(0)
    model = Decoder(config.model, 65)
    x, y = torch.randint(0, 65, (batch, context)), torch.randint(0, 65, (batch, context))
    times = []
    for _ in range(steps + 2):
        started = time.perf_counter()
        with onednn_linears(ONEDNN), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(x, y)
            assert loss is not None
            loss.backward()
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--record", action="store_true", help="append the map to docs/benchmarks.md")
    args = parser.parse_args()
    units = cpu_bf16_units()
    print(f"bf16 matrix units on this CPU: {units or 'none'}; float32 on {'oneDNN' if ONEDNN else 'torch'}'s kernels")
    rows = []
    for width in WIDTHS:
        for batch, context in BATCHES:
            fp32 = step_seconds(width, batch, context, False, args.steps)
            bf16 = step_seconds(width, batch, context, True, args.steps)
            picks = "bfloat16" if units and cpu_bf16_pays(width, batch * context, units, ONEDNN) else "float32"
            rows.append(
                [
                    str(width),
                    f"{batch} x {context} = {batch * context:,}",
                    f"{fp32 * 1e3:.1f}",
                    f"{bf16 * 1e3:.1f}",
                    f"{fp32 / bf16:.2f}x",
                    picks,
                ]
            )
            print(" | ".join(rows[-1]), flush=True)
    if args.record:
        header = [
            "n_embd",
            "batch x context = tokens",
            "float32 ms/step",
            "bf16 ms/step",
            "bf16 speed-up",
            "auto picks",
        ]
        kernels = "oneDNN's" if ONEDNN else "torch's default"
        append_section(f"bf16 autocast against float32 ({kernels} kernels) on the CPU, per training step", header, rows)


if __name__ == "__main__":
    main()
