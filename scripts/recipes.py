"""Compare training recipes side by side: each recipe and seed through the real CLI, alternating, in one invocation.

    python scripts/recipes.py --data data/tinyshakespeare.txt --seeds 1337 1338 1339 \\
        --recipe "cosine:" --recipe "plateau:train.lr_schedule=plateau train.eval_interval=100"

A recipe is NAME:SETTINGS, the settings being `section.key=value` items applied over --config (default: cpu,
configs/cpu.yaml). With --budget 10m every run is `charlm train --budget 10m`: a recipe's settings are kept over
what the budget's rule picks, and a recipe with none is the rule's own pick (charlm/training/budget_rule.py). A
recipe's own `budget=10m` item gives that recipe alone the flag, so that the rule and the fixed recipe given the
same time (`fixed:train.max_seconds=570`, the rule's share of 600 s) run in one invocation; `threads=1` runs that
recipe with OMP_NUM_THREADS=1 (a slower machine: ~70% of the speed on a 2-core CPU), and `speed=13k` gives the
budget's rule that speed instead of measuring it (`--speed`), so that one machine setting can train another's pick;
`config=none` runs that recipe with no --config, as plain `charlm train` (the rule at 100 s, its speed measured
unless `speed=` gives it). Runs alternate (seed 1: every recipe, seed 2: every recipe, ...) so that the machine's
drift falls on all recipes alike. Each run's wall time is measured around `charlm train` (start-up and the final
full validation pass included, as a user waits for them); its loss is the full validation pass of best.pt. With
--record TITLE the table and the per-recipe median / min / max go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import append_section, run_charlm, set_args

RECIPE_ITEMS = ("budget", "threads", "speed", "config")  # a recipe's own flags and environment, not config keys


def train(config: str, data: str, seed: int, sets: list[str], out_dir: Path, budget: str | None = None) -> dict:
    own = {key: value for key, _, value in (item.partition("=") for item in sets) if key in RECIPE_ITEMS}
    config = own.get("config", config)
    chosen = [] if config == "none" else ["--config", config]  # none: plain `charlm train`, the rule at 100 s
    args = ["train", *chosen, "--data", data, "--out-dir", str(out_dir), "--seed", str(seed)]
    budget, sets = own.get("budget", budget), [item for item in sets if item.partition("=")[0] not in RECIPE_ITEMS]
    flags = [*(["--budget", budget] if budget else []), *(["--speed", own["speed"]] if "speed" in own else [])]
    env = {"OMP_NUM_THREADS": own["threads"]} if "threads" in own else None
    summary, wall = run_charlm(*args, *flags, *set_args(sets), env=env)
    return {**summary, "outer_wall_s": wall}


def run_recipes(
    config: str, data: str, seeds: list[int], recipes: list[tuple[str, list[str]]], budget: str | None = None
) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for name, sets in recipes:
                s = train(config, data, seed, sets, Path(tmp) / f"{name}-{seed}", budget)
                rows.append(
                    {
                        "recipe": name,
                        "seed": seed,
                        "loss": s["full_val_loss"],
                        "wall": s["outer_wall_s"],
                        "steps": s["steps"],
                        "tokens_per_s": s["tokens_per_s"],
                        "stop": s["stop_reason"],
                    }
                )
                print(
                    f"{name:>24}  seed {seed}  full-val {s['full_val_loss']:.4f}  wall {s['outer_wall_s']:6.1f} s  "
                    f"{s['steps']:>6,} steps  {s['tokens_per_s']:>8,.0f} tok/s  ({s['stop_reason']})",
                    flush=True,
                )
    return rows


def summarize(rows: list[dict], recipes: list[tuple[str, list[str]]]) -> list[dict]:
    out = []
    for name, sets in recipes:
        mine = [r for r in rows if r["recipe"] == name]
        losses, walls = [r["loss"] for r in mine], [r["wall"] for r in mine]
        out.append(
            {
                "recipe": name,
                "settings": " ".join(sets) or "(the config as shipped)",
                "median": statistics.median(losses),
                "min": min(losses),
                "max": max(losses),
                "wall_max": max(walls),
                "wall_median": statistics.median(walls),
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
            }
        )
    return out


def parse_recipe(text: str) -> tuple[str, list[str]]:
    name, sep, settings = text.partition(":")
    if not sep or not name:
        raise SystemExit(f"--recipe takes NAME:SETTINGS, got {text!r}")
    return name, settings.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--config", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338, 1339])
    parser.add_argument("--recipe", action="append", required=True, help="NAME:SETTINGS (repeatable)")
    parser.add_argument("--budget", help="charlm train --budget for every run (10m, 1h): the rule's recipe under each")
    parser.add_argument("--record", metavar="TITLE", help="append the figures to docs/benchmarks.md")
    args = parser.parse_args()
    recipes = [parse_recipe(r) for r in args.recipe]
    rows = run_recipes(args.config, args.data, args.seeds, recipes, args.budget)
    summary = summarize(rows, recipes)
    print()
    for s in summary:
        print(
            f"{s['recipe']:>24}  median {s['median']:.4f}  min {s['min']:.4f}  max {s['max']:.4f}  "
            f"wall median {s['wall_median']:.1f} s, max {s['wall_max']:.1f} s  ({s['settings']})"
        )
    if args.record:
        append_section(
            args.record,
            ["recipe", "settings", "seed", "full-val loss", "wall s", "steps", "tokens/s"],
            [
                [
                    r["recipe"],
                    next(s["settings"] for s in summary if s["recipe"] == r["recipe"]),
                    str(r["seed"]),
                    f"{r['loss']:.4f}",
                    f"{r['wall']:.1f}",
                    f"{r['steps']:,}",
                    f"{r['tokens_per_s']:,.0f}",
                ]
                for r in rows
            ]
            + [
                [
                    f"**{s['recipe']}**",
                    "median / min / max",
                    "",
                    f"**{s['median']:.4f}** / {s['min']:.4f} / {s['max']:.4f}",
                    f"max {s['wall_max']:.1f}",
                    "",
                    f"{s['tokens_per_s']:,.0f}",
                ]
                for s in summary
            ],
        )


if __name__ == "__main__":
    main()
