"""configs/notebook.yaml next to the course notebook's own code, in one invocation on this machine.

    python scripts/vs_notebook.py --notebook /path/to/course_notebook.py --data data/tinyshakespeare.txt [--record]

The notebook script (the course's cells assembled into one file; not part of this repository) is run as
`python NOTEBOOK DATA` and its closing `RESULT wall ... full-val ...` line is read; then `charlm train --config
notebook` runs and its full validation pass of best.pt is read. Both losses are full passes over the last 10% in
32-character windows. Wall times include start-up.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import append_section, run_charlm, run_timed

timed = run_timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebook", required=True, help="the course notebook as one Python script")
    parser.add_argument("--data", required=True)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    out, wall = timed([sys.executable, args.notebook, args.data])
    found = re.search(r"RESULT wall ([\d.]+)s full-val ([\d.]+)", out)
    if not found:
        raise SystemExit(f"no RESULT line in the notebook's output:\n{out[-2000:]}")
    steps = re.findall(r"Step (\d+):", out)
    notebook = {
        "loss": float(found.group(2)),
        "wall": wall,
        "steps": int(steps[-1]) if steps else 0,
        "early_stop": "early stop" in out,
    }
    print(
        f"notebook's own code: full-val {notebook['loss']:.4f} nats/char in {wall:.1f} s "
        f"(last check at step {notebook['steps']:,}{', early stop' if notebook['early_stop'] else ''})",
        flush=True,
    )

    with tempfile.TemporaryDirectory() as tmp:
        s, wall = run_charlm("train", "--config", "notebook", "--data", args.data, "--out-dir", str(Path(tmp) / "nb"))
    print(
        f"charlm --config notebook: full-val {s['full_val_loss']:.4f} nats/char in {wall:.1f} s "
        f"({s['steps']:,} steps, {s['stop_reason']})"
    )
    if args.record:
        append_section(
            "configs/notebook.yaml beside the course notebook's own code (scripts/vs_notebook.py)",
            ["run", "full-val loss", "wall s", "steps", "ended by"],
            [
                [
                    "the notebook's own code",
                    f"{notebook['loss']:.4f}",
                    f"{notebook['wall']:.1f}",
                    f"{notebook['steps']:,} (last check)",
                    "early stop" if notebook["early_stop"] else "30,000 steps",
                ],
                [
                    "`charlm train --config notebook`",
                    f"{s['full_val_loss']:.4f}",
                    f"{wall:.1f}",
                    f"{s['steps']:,}",
                    s["stop_reason"],
                ],
            ],
        )


if __name__ == "__main__":
    main()
