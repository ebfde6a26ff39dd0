"""Run a SIGMORPHON shared task end to end: each language's training, dev and test files through charlm, one command,
the per-language table printed beside the task's published baseline, and predictions in the task's submission format.

    git clone https://github.com/sigmorphon/2022G2PST
    python scripts/shared_task.py g2p-2022-high --repo 2022G2PST --out runs/g2p-2022 --seconds 280

g2p-2022-high is the SIGMORPHON 2022 grapheme-to-phoneme task's "high" subtask: ten languages of ~800 training words,
100 dev and 100 test words. Its repository ships the test words without their pronunciations, so charlm is scored on
the dev files, which are held out of everything else: each language trains on its training words, best.pt chosen on
a tenth of them (data.val_fraction), and only then is the dev file scored (word error rate: the share of words whose
predicted phones differ from the reference; the task's metric) and the test words transcribed into
OUT/LANG/predictions.tsv (word<TAB>phones, the format the task asks for). The baseline is the task's CLUZH system as
its README reports it, per language and macro-averaged. With --record TITLE the table goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import append_section, run_charlm, run_timed


@dataclass(frozen=True)
class Task:
    """A shared task's files in its repository, its languages and its baseline's published dev figures."""

    name: str
    url: str
    languages: tuple[str, ...]
    train: str  # paths inside the repository, {lang} filled in
    dev: str
    test: str  # sources only (the task keeps the answers)
    config: str  # charlm's recipe for it
    baseline: str  # whose figures `baseline_dev` holds
    baseline_dev: dict[str, float]  # word error rate, %, per language


G2P_2022_HIGH = Task(
    name="g2p-2022-high",
    url="https://github.com/sigmorphon/2022G2PST",
    languages=("ben", "bur", "ger", "gle", "ita", "per", "swe", "tgl", "tha", "ukr"),
    train="data/target_languages/{lang}_train.tsv",
    dev="data/target_languages/{lang}_dev.tsv",
    test="data/target_languages/{lang}_test.tsv",
    config="configs/g2p-shared.yaml",
    baseline="CLUZH (the task's README, high subtask)",
    baseline_dev={
        "ben": 50.68,
        "bur": 22.00,
        "ger": 41.00,
        "gle": 33.00,
        "ita": 15.00,
        "per": 58.93,
        "swe": 52.00,
        "tgl": 17.00,
        "tha": 16.00,
        "ukr": 25.00,
    },
)
TASKS = {task.name: task for task in (G2P_2022_HIGH,)}


def run_language(task: Task, repo: Path, lang: str, out: Path, seconds: float, seed: int) -> dict:
    """Train on the language's training words, score its dev file, transcribe its test words."""
    files = {part: repo / getattr(task, part).format(lang=lang) for part in ("train", "dev", "test")}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not found: is --repo a clone of {task.url}?")
    run = out / lang
    sets = ["data.val_fraction=0.1", "data.test_fraction=0"]  # best.pt on a tenth of the training words
    train, wall = run_charlm(
        "train", "--config", str(Path(__file__).resolve().parents[1] / task.config), "--data", str(files["train"]),
        "--out-dir", str(run), "--overwrite", "--seed", str(seed), "--max-seconds", str(seconds),
        *(x for item in sets for x in ("--set", item)),
    )  # fmt: skip
    dev, _ = run_charlm("eval", str(run), "--data", str(files["dev"]), "--split", "all")
    words = run / "test-words.txt"
    words.write_text("".join(line.split("\t")[0] + "\n" for line in read_lines(files["test"])), encoding="utf-8")
    sample = ["sample", str(run), "--prompt-file", str(words), "--unknown", "replace"]  # the learned unknown symbol
    predicted, _ = run_timed([sys.executable, "-m", "charlm", *sample])
    (run / "predictions.tsv").write_text(predicted, encoding="utf-8")
    return {
        "lang": lang,
        "wer": 100 * dev["word_error_rate"],
        "per": 100 * (dev["token_error_rate"] or 0.0),
        "baseline": task.baseline_dev[lang],
        "train_words": len(read_lines(files["train"])),
        "steps": train["steps"],
        "wall": wall,
    }


def read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--repo", type=Path, required=True, help="a clone of the task's repository")
    parser.add_argument("--out", type=Path, required=True, help="run folders and predictions, one folder a language")
    parser.add_argument("--languages", nargs="+", help="default: all of the task's")
    parser.add_argument("--seconds", type=float, default=280.0, help="training seconds per language")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--record", metavar="TITLE", help="append the table to docs/benchmarks.md")
    args = parser.parse_args()
    task = TASKS[args.task]
    languages = args.languages or list(task.languages)
    unknown = sorted(set(languages) - set(task.languages))
    if unknown:
        raise SystemExit(f"{', '.join(unknown)}: not a language of {task.name} ({', '.join(task.languages)})")
    if not args.repo.is_dir():
        raise SystemExit(f"--repo {args.repo} is not a folder: clone {task.url} first")
    revision = subprocess.run(
        ["git", "-C", str(args.repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    results = []
    for lang in languages:
        result = run_language(task, args.repo, lang, args.out, args.seconds, args.seed)
        results.append(result)
        print(json.dumps(result), flush=True)
    header = ["language", "training words", "charlm dev WER %", "charlm dev PER %", f"{task.baseline} dev WER %"]
    header += ["steps", "wall s"]
    rows = [
        [r["lang"], f"{r['train_words']:,}", f"{r['wer']:.2f}", f"{r['per']:.2f}", f"{r['baseline']:.2f}"]
        + [f"{r['steps']:,}", f"{r['wall']:.0f}"]
        for r in results
    ]
    mean = [statistics.fmean(r[key] for r in results) for key in ("wer", "per", "baseline")]
    rows.append(["**macro-average**", "", f"**{mean[0]:.2f}**", f"{mean[1]:.2f}", f"**{mean[2]:.2f}**", "", ""])
    width = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, width, strict=True)))
    if revision.returncode == 0:
        print(f"{task.url} at {revision.stdout.strip()}")
    if args.record:
        append_section(args.record, header, rows)


if __name__ == "__main__":
    main()
