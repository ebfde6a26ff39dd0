"""charlm and makemore on makemore's names.txt, alternately in one invocation, their test losses measured alike.

    python scripts/vs_makemore.py --makemore /path/to/makemore [--rounds 2] [--record]

/path/to/makemore is a checkout of https://github.com/karpathy/makemore (git clone it; it is run there, never copied
into this repository). Its makemore.py imports torch.utils.tensorboard, so the Python running this script needs the
tensorboard package (`pip install -e ".[tensorboard]"`).

The split. makemore.py's main seeds torch (torch.manual_seed(--seed), 3407 by default) and then calls its
create_datasets, which holds out min(1000, 10%) of the names by a torch.randperm. This script does exactly that in
the checkout, by importing makemore.py and calling its own create_datasets after the same torch.manual_seed, and
writes the two halves to train.txt and test.txt in a scratch folder: makemore's run draws the same permutation, so
both programs hold out the same 1,000 test names, and charlm trains on train.txt (its recipe takes its validation
names from those) and never sees test.txt until it is scored.

Each round, charlm first, then makemore:
1. `charlm train --config configs/names.yaml --data train.txt` (data.test_fraction=0: the test names are the
   held-out file), its wall time W taken start-up included;
2. `python makemore.py -i names.txt -o WORK` with its defaults (the ~200K-parameter Transformer, 4 layers, 64 wide,
   batch 32, AdamW 5e-4), stopped after W seconds of wall time (or --seconds). makemore saves model.pt whenever its
   periodic test estimate improves (every 500 steps), so what is scored is its best-by-test checkpoint.
Both are then scored the same way on the 1,000 test names: -ln p of every character and of the end symbol after the
last one, given the start symbol, summed and divided by the characters plus one end symbol per name (nats per
character, makemore's measure): `charlm eval RUN --data test.txt`, and makemore's model.pt loaded into its own
Transformer class in the checkout. makemore's own last printed test loss is shown beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import append_section, run_charlm, run_timed, set_args

REPO = Path(__file__).resolve().parents[1]

# Runs with the checkout on sys.path: makemore's own create_datasets after makemore.py's torch.manual_seed, then
# either the split written out, or model.pt scored on the test names (each name's characters and its end token).
MAKEMORE_PROBE = r"""
import json, sys
import torch
command, checkout, names, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, checkout)
import makemore
torch.manual_seed(seed)
train, test = makemore.create_datasets(names)
if command == "split":
    for name, dataset in (("train", train), ("test", test)):
        with open(f"{sys.argv[5]}/{name}.txt", "w") as f:
            f.write("\n".join(dataset.words) + "\n")
    print(json.dumps({"train": len(train.words), "test": len(test.words)}))
else:
    config = makemore.ModelConfig(vocab_size=train.get_vocab_size(), block_size=train.get_output_length(),
                                  n_layer=4, n_head=4, n_embd=64, n_embd2=64)
    model = makemore.Transformer(config)
    model.load_state_dict(torch.load(sys.argv[5], map_location="cpu"))
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(test)):
            x, y = test[i]
            logits, _ = model(x[None])
            scored = y >= 0
            total += torch.nn.functional.cross_entropy(logits[0][scored], y[scored], reduction="sum").item()
            count += int(scored.sum())
    print(json.dumps({"loss": total / count, "chars": count, "names": len(test)}))
"""


def probe(checkout: Path, command: str, names: Path, seed: int, arg: Path) -> dict:
    out, _ = run_timed([sys.executable, "-c", MAKEMORE_PROBE, command, checkout, names, seed, arg])
    return json.loads(out.strip().splitlines()[-1])


def run_makemore(checkout: Path, names: Path, work: Path, seed: int, seconds: float) -> dict:
    """makemore.py with its defaults for `seconds` of wall time, then stopped: its last step, its last printed test
    loss, and model.pt (None before its first evaluation, at step 500)."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "makemore.log"
    args = [sys.executable, "-u", str(checkout / "makemore.py"), "-i", str(names), "-o", str(work), "--seed", str(seed)]
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=seconds)
            raise SystemExit(f"makemore stopped by itself before {seconds:.0f} s:\n{log.read_text()[-3000:]}")
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)  # its own session: makemore and its data-loader workers
            process.wait()
    wall = time.perf_counter() - started
    text = log.read_text()
    steps = [int(s) for s in re.findall(r"^step (\d+) \|", text, re.M)]
    tests = [float(t) for t in re.findall(r"test loss: ([\d.]+)", text)]
    model = work / "model.pt"
    return {
        "wall": wall,
        "steps": steps[-1] if steps else 0,
        "own_test": tests[-1] if tests else None,
        "best_own_test": min(tests) if tests else None,
        "model": model if model.exists() else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--makemore", required=True, type=Path, help="a checkout of karpathy/makemore")
    parser.add_argument("--names", type=Path, help="the list to compare on (default: the checkout's names.txt)")
    parser.add_argument("--config", default=str(REPO / "configs" / "names.yaml"), help="charlm's recipe")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a charlm override (repeatable)")
    parser.add_argument("--seed", type=int, default=3407, help="makemore's --seed (its default), which sets the split")
    parser.add_argument("--rounds", type=int, default=1, help="charlm then makemore, this many times")
    parser.add_argument("--seconds", type=float, help="makemore's wall time (default: charlm's run's, each round)")
    parser.add_argument("--record", action="store_true", help="append the table to docs/benchmarks.md")
    args = parser.parse_args()
    checkout = args.makemore.resolve()
    names = (args.names or checkout / "names.txt").resolve()
    if not (checkout / "makemore.py").is_file() or not names.is_file():
        raise SystemExit(f"{checkout} is not a makemore checkout with makemore.py and {names.name}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        split = probe(checkout, "split", names, args.seed, scratch)
        test = scratch / "test.txt"
        print(f"makemore's split (seed {args.seed}): {split['train']:,} training names, {split['test']:,} test names")
        for round_ in range(1, args.rounds + 1):
            run = scratch / f"charlm-{round_}"
            overrides = set_args(["data.test_fraction=0", *args.sets])
            summary, c_wall = run_charlm(
                "train", "--config", args.config, "--data", str(scratch / "train.txt"), "--out-dir", str(run),
                *overrides,
            )  # fmt: skip
            c_test, _ = run_charlm("eval", str(run), "--data", str(test))
            seconds = args.seconds or c_wall
            m = run_makemore(checkout, names, scratch / f"makemore-{round_}", args.seed, seconds)
            m_test = probe(checkout, "score", names, args.seed, m["model"])["loss"] if m["model"] else None
            assert c_test["items"] == split["test"], (c_test["items"], split["test"])
            shown = f"{m_test:.4f}" if m_test is not None else "no model.pt yet (first evaluation at step 500)"
            own = f"{m['own_test']:.4f} (best {m['best_own_test']:.4f})" if m["own_test"] is not None else "none yet"
            print(
                f"round {round_}\n"
                f"    charlm    test loss {c_test['loss']:.4f} nats/char, {summary['steps']:,} steps, {c_wall:.1f} s\n"
                f"    makemore  test loss {shown} nats/char, {m['steps']:,} steps, {m['wall']:.1f} s; "
                f"its own last estimate {own}",
                flush=True,
            )
            rows.append([
                str(round_), f"{c_wall:.1f} s", f"{c_test['loss']:.4f}", f"{summary['steps']:,}",
                f"{m['wall']:.1f} s", f"{m_test:.4f}" if m_test is not None else "-", f"{m['steps']:,}", own,
            ])  # fmt: skip
    if args.record:
        header = ["round", "charlm wall", "charlm test", "charlm steps", "makemore wall", "makemore test"]
        header += ["makemore steps", "makemore's own estimate"]
        title = "charlm and makemore on names.txt, the same 1,000 test names, nats/char with the end symbol"
        append_section(f"{title} (scripts/vs_makemore.py)", header, rows)


if __name__ == "__main__":
    main()
