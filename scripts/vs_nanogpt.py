"""charlm and nanoGPT side by side on this machine: the two alternately, in one invocation, with the ratios.

    python scripts/vs_nanogpt.py --nanogpt /path/to/nanoGPT --data data/tinyshakespeare.txt [--record]
    python scripts/vs_nanogpt.py --nanogpt /path/to/nanoGPT --data CORPUS.txt --budget 10m [--record]

/path/to/nanoGPT is a checkout of https://github.com/karpathy/nanoGPT (git clone it; it is run there, never copied
into this repository). It needs numpy and requests in the Python running this script (its prepare.py and train.py
import them). The corpus is copied into a scratch copy of the checkout, so its prepare.py needs no network.

Pairs, each nanoGPT then charlm:
1. nanoGPT's published CPU recipe (4 x 128, context 64, batch 12, 2,000 iters) against plain `charlm train`;
2. the same nanoGPT recipe stretched (iterations and decay) to the wall time charlm's run took, against
   `charlm train` again;
3. throughput on nanoGPT's CPU shape, twice: nanoGPT's own ms/iter (median of its log of 600 iterations) against
   charlm's 600 steps at that shape;
4. generating 1,000 characters with the 6 x 384, context-256 "baby GPT" (one training step each, then sampling
   at batch 1): nanoGPT's generate() (no KV cache) against `charlm sample`: float32, --precision int8, and int8
   with --compile (its compile time reported beside, as `--json` gives it, apart from chars/s).
Losses are full validation passes: every character of the last 10% scored once, in non-overlapping windows of the
model's context, for both. Wall times include start-up, as a user waits for them.

With --budget (any corpus; `charlm train --budget` takes the same forms, e.g. 300s, 10m, 1h) only the equal-time
comparison runs: `charlm train --data CORPUS --budget B` (the budget rule picks the model for the time and the
corpus's size) first, then nanoGPT's CPU recipe stretched to the wall time charlm took: its iterations (and decay)
set from a 1,000-iteration calibration run of the same recipe. Both are scored on the same text: the first
characters of the validation split (the last 10% of the file, split by characters as nanoGPT's prepare.py does), as
many as charlm's end-of-run pass scored (train.final_eval_tokens, 1M by default), in bits per character too.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import NANOGPT_SHAPE, append_section, run_charlm, run_timed, set_args

NANOGPT_CPU = [
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--dropout=0.0",
]
CHARLM_NANOGPT_SHAPE = ["--config", "tiny", *set_args(NANOGPT_SHAPE)]

# Runs in the nanoGPT checkout with its own model.py: a full validation pass over val.bin, or timed generation.
NANOGPT_PROBE = r"""
import json, math, sys, time
import numpy as np, torch
from model import GPT, GPTConfig
ckpt = torch.load(sys.argv[2], map_location="cpu")
model = GPT(GPTConfig(**ckpt["model_args"]))
model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
model.eval()
if sys.argv[1] == "fullval":
    T = ckpt["model_args"]["block_size"]
    ids = torch.from_numpy(np.fromfile(sys.argv[3], dtype=np.uint16).astype(np.int64))
    if len(sys.argv) > 4:  # score the first N characters only (as charlm's capped end-of-run pass does)
        ids = ids[: int(sys.argv[4]) + 1]
    n = (len(ids) - 1) // T
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, 64):
            starts = torch.arange(i, min(i + 64, n)) * T
            x = torch.stack([ids[s:s + T] for s in starts]); y = torch.stack([ids[s + 1:s + T + 1] for s in starts])
            _, loss = model(x, y); total += loss.item() * y.numel(); count += y.numel()
        rest = len(ids) - 1 - n * T
        if rest:
            x, y = ids[n * T:-1][None], ids[n * T + 1:][None]
            _, loss = model(x, y); total += loss.item() * y.numel(); count += y.numel()
    print(json.dumps({"loss": total / count, "chars": count}))
else:
    x = torch.tensor([[0]])
    with torch.no_grad():
        started = time.perf_counter()
        model.generate(x, int(sys.argv[3]), temperature=0.8)
        dt = time.perf_counter() - started
    print(json.dumps({"chars_per_s": int(sys.argv[3]) / dt}))
"""


run = run_timed
charlm = run_charlm


def prepare_nanogpt(checkout: Path, data: Path, scratch: Path) -> Path:
    work = scratch / "nanoGPT"
    shutil.copytree(checkout, work, ignore=shutil.ignore_patterns(".git", "out*"))
    shutil.copy(data, work / "data" / "shakespeare_char" / "input.txt")
    run([sys.executable, "prepare.py"], cwd=work / "data" / "shakespeare_char")
    return work


def nanogpt_train(work: Path, out_dir: Path, iters: int, extra: list[str]) -> tuple[float, list[float]]:
    args = [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        f"--out_dir={out_dir}",
        f"--max_iters={iters}",
        f"--lr_decay_iters={iters}",
        *extra,
    ]
    out, wall = run(args, cwd=work)
    ms = [float(m) for m in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", out)]
    return wall, ms


def iterations_for(seconds: float, wall: float, ms: list[float]) -> int:
    """nanoGPT's iterations that fill `seconds` of wall time, from a run of len(ms) iterations that took `wall`: its
    log times every iteration (evaluations and checkpoints inside the iterations they fall on), so the mean of those
    times is the pace of a longer run, and what the log leaves out (start-up) is paid once; scaling the whole wall
    time would charge the start-up again for every calibration run's worth of iterations."""
    if not ms:
        raise SystemExit("nanoGPT's log had no 'iter N: loss L, time Tms' lines: is the checkout karpathy/nanoGPT?")
    start_up = max(0.0, wall - sum(ms) / 1000)
    return max(1, round((seconds - start_up) / (sum(ms) / len(ms) / 1000)))


def nanogpt_probe(work: Path, mode: str, ckpt: Path, arg: str, *more: str) -> dict:
    out, _ = run([sys.executable, "-c", NANOGPT_PROBE, mode, str(ckpt), arg, *more], cwd=work)
    return json.loads(out.strip().splitlines()[-1])


def equal_budget(args: argparse.Namespace, work: Path, scratch: Path, report) -> None:
    """`charlm train --budget B` on the corpus, then nanoGPT's CPU recipe stretched to the wall time it took."""
    c_sum, c_wall = charlm("train", "--data", str(args.data), "--budget", args.budget, "--out-dir", str(scratch / "c"))
    cal_wall, cal_ms = nanogpt_train(work, scratch / "n-cal", 1000, NANOGPT_CPU)
    iters = iterations_for(c_wall, cal_wall, cal_ms)
    n_wall, _ = nanogpt_train(work, scratch / "n", iters, NANOGPT_CPU)
    val_bin = work / "data" / "shakespeare_char" / "val.bin"
    scored = c_sum["full_val_tokens"]
    n = nanogpt_probe(work, "fullval", scratch / "n" / "ckpt.pt", str(val_bin), str(scored))
    if n["chars"] != scored:
        raise SystemExit(f"nanoGPT scored {n['chars']:,} characters, charlm {scored:,}: the splits differ")
    bits = 1 / math.log(2)
    report(
        f"{args.data.name}, budget {args.budget}: full-val loss on the same {scored:,} validation characters",
        f"{c_sum['full_val_loss']:.4f} nats/char, {c_sum['full_val_loss'] * bits:.4f} bits/char ({c_wall:.0f} s, "
        f"{c_sum['steps']:,} steps, {c_sum['params']:,} parameters)",
        f"{n['loss']:.4f} nats/char, {n['loss'] * bits:.4f} bits/char ({n_wall:.0f} s, CPU recipe stretched to "
        f"{iters:,} iters)",
        f"charlm {n['loss'] - c_sum['full_val_loss']:.3f} nats/char lower",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", required=True, type=Path, help="a checkout of karpathy/nanoGPT")
    parser.add_argument("--data", required=True, type=Path, help="tiny-shakespeare's input.txt, or any text")
    parser.add_argument("--budget", help="only the equal-time comparison, charlm trained with --budget BUDGET")
    parser.add_argument("--record", action="store_true", help="append the table to docs/benchmarks.md")
    args = parser.parse_args()
    rows = []

    def report(what: str, ours: str, theirs: str, ratio: str) -> None:
        rows.append([what, theirs, ours, ratio])
        print(f"{what}\n    nanoGPT {theirs}\n    charlm  {ours}\n    {ratio}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        work = prepare_nanogpt(args.nanogpt, args.data, scratch)
        if args.budget:
            equal_budget(args, work, scratch, report)
        else:
            the_four_comparisons(args, work, scratch, report)

    if args.record:
        append_section(
            "charlm against nanoGPT, side by side (scripts/vs_nanogpt.py)", ["what", "nanoGPT", "charlm", "ratio"], rows
        )


def the_four_comparisons(args: argparse.Namespace, work: Path, scratch: Path, report) -> None:
    """Default recipes; nanoGPT stretched to charlm's default wall time; throughput; generation speed."""
    val_bin = work / "data" / "shakespeare_char" / "val.bin"

    # 1. the CPU recipe against the default charlm run
    n_wall, n_ms = nanogpt_train(work, scratch / "n1", 2000, NANOGPT_CPU)
    n_loss = nanogpt_probe(work, "fullval", scratch / "n1" / "ckpt.pt", str(val_bin))["loss"]
    c_sum, c_wall = charlm("train", "--data", str(args.data), "--out-dir", str(scratch / "c1"))
    report(
        "default recipes: full-val loss (wall time incl. start-up)",
        f"{c_sum['full_val_loss']:.4f} nats/char ({c_wall:.1f} s)",
        f"{n_loss:.4f} nats/char ({n_wall:.1f} s), CPU recipe 2,000 iters",
        f"charlm {n_loss - c_sum['full_val_loss']:.3f} nats/char lower, in {c_wall / n_wall:.2f}x the time",
    )

    # 2. nanoGPT stretched to charlm's wall time
    iters = iterations_for(c_wall, n_wall, n_ms)
    s_wall, _ = nanogpt_train(work, scratch / "n2", iters, NANOGPT_CPU)
    s_loss = nanogpt_probe(work, "fullval", scratch / "n2" / "ckpt.pt", str(val_bin))["loss"]
    c2_sum, c2_wall = charlm("train", "--data", str(args.data), "--out-dir", str(scratch / "c2"))
    report(
        f"same wall time: nanoGPT's recipe stretched to {iters:,} iters",
        f"{c2_sum['full_val_loss']:.4f} nats/char ({c2_wall:.1f} s)",
        f"{s_loss:.4f} nats/char ({s_wall:.1f} s)",
        f"charlm {s_loss - c2_sum['full_val_loss']:.3f} nats/char lower",
    )

    # 3. throughput on nanoGPT's CPU shape: two pairs, each nanoGPT's 600 iterations (median ms/iter of its log
    # after the first 10) then charlm's 600 steps, alternating
    for pair in (1, 2):
        _, t_ms = nanogpt_train(work, scratch / f"n3-{pair}", 600, NANOGPT_CPU)
        n_tps = 12 * 64 / (statistics.median(t_ms[10:]) / 1000)
        t_sum, _ = charlm(
            "train", *CHARLM_NANOGPT_SHAPE, "--data", str(args.data), "--out-dir", str(scratch / f"c3-{pair}")
        )
        report(
            f"training throughput, 4 x 128, context 64, batch 12 (pair {pair})",
            f"{t_sum['tokens_per_s']:,.0f} tokens/s",
            f"{n_tps:,.0f} tokens/s",
            f"{t_sum['tokens_per_s'] / n_tps:.2f}x",
        )

    # 4. generation with the baby GPT (6 x 384, context 256), 1,000 characters at batch 1
    baby = [
        "--device=cpu",
        "--compile=False",
        "--eval_interval=1",
        "--eval_iters=1",
        "--always_save_checkpoint=True",
        "--batch_size=4",
    ]
    nanogpt_train(work, scratch / "n4", 1, baby)
    n_gen = nanogpt_probe(work, "generate", scratch / "n4" / "ckpt.pt", "1000")["chars_per_s"]
    charlm(
        "train",
        "--config",
        "gpu",
        "--data",
        str(args.data),
        "--out-dir",
        str(scratch / "c4"),
        "--device",
        "cpu",
        "--max-steps",
        "1",
        "--set",
        "train.batch_size=4",
        "--set",
        "train.eval_windows=4",
        "--set",
        "train.compile=false",
    )
    for flags in ("--precision float32", "--precision int8", "--precision int8 --compile"):
        c_gen, _ = charlm(
            "sample", str(scratch / "c4" / "best.pt"), "--max-new-tokens", "1000", "--seed", "0", "--device", "cpu",
            *flags.split(),
        )  # fmt: skip
        compiling = f" (compiling: {c_gen['compile_s']:.1f} s before)" if "compile_s" in c_gen else ""
        report(
            f"sampling 1,000 characters, 6 x 384, context 256, batch 1 (charlm {flags})",
            f"{c_gen['chars_per_s']:,.0f} chars/s{compiling}",
            f"{n_gen:,.0f} chars/s (no KV cache)",
            f"{c_gen['chars_per_s'] / n_gen:.1f}x",
        )


if __name__ == "__main__":
    main()
