"""Draw full-validation loss against the time budget, one line per recipe, from figures given on the command line.

    python scripts/plot_budget.py -o docs/budget-tinyshakespeare.png --title "tiny-shakespeare" \
        --series "charlm train --budget T: 100s=1.5322 10m=1.4512 1h=1.4283" \
        --series "configs/cpu.yaml given T: 100s=1.5322 10m=1.4916 1h=1.5009"

A series is LABEL: BUDGET=LOSS ..., each budget written as `--budget` takes it (100s, 10m, 1h); the budgets go on a
logarithmic axis. The figures are the medians (or single runs) that docs/benchmarks.md records with their commands:
this script only draws them, so the plot and the tables cannot disagree about where a figure came from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from charlm.errors import UsageError
from charlm.files import atomic_write
from charlm.training.budget_rule import parse_budget


def parse_series(text: str) -> tuple[str, list[tuple[float, str, float]]]:
    """'LABEL: 100s=1.53 10m=1.46' -> (label, [(seconds, '100s', loss), ...]) sorted by seconds."""
    label, sep, items = text.rpartition(":")
    if not sep or not label.strip() or not items.split():
        raise SystemExit(f"--series takes 'LABEL: BUDGET=LOSS ...', got {text!r}")
    points = []
    for item in items.split():
        budget, _, loss = item.partition("=")
        try:
            points.append((parse_budget(budget, "--series"), budget, float(loss)))
        except UsageError as e:
            raise SystemExit(str(e)) from None
        except ValueError:
            raise SystemExit(f"--series: {item!r} is not BUDGET=LOSS (for instance 10m=1.4628)") from None
    return label.strip(), sorted(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", action="append", required=True, help="LABEL: BUDGET=LOSS ... (repeatable)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default="full-validation loss against the time budget")
    args = parser.parse_args()
    series = [parse_series(s) for s in args.series]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit('this script draws with matplotlib: pip install -e ".[plot]"') from None

    fig, ax = plt.subplots(figsize=(6.4, 4.2), constrained_layout=True)
    ticks: dict[float, str] = {}
    labelled: set[tuple[float, float]] = set()
    for label, points in series:
        xs, ys = [p[0] for p in points], [p[2] for p in points]
        ax.plot(xs, ys, marker="o", label=label)
        for seconds, budget, loss in points:
            ticks[seconds] = budget
            if (seconds, round(loss, 4)) in labelled:
                continue  # the same figure in two series (the 100 s rule is the fixed recipe): one label
            labelled.add((seconds, round(loss, 4)))
            ax.annotate(f"{loss:.4f}", (seconds, loss), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xticks(sorted(ticks), [ticks[s] for s in sorted(ticks)])
    ax.minorticks_off()
    ax.set_xlabel("time budget (--budget)")
    ax.set_ylabel("full-validation loss of best.pt (nats/char)")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.output, lambda f: fig.savefig(f, format="png", dpi=120))  # never half a picture
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
