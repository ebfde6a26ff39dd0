"""Run a SIGMORPHON shared task end to end: each language's training, dev and test files through charlm, one command,
the per-language table printed beside the task's baseline, and predictions in the task's submission format.

    git clone https://github.com/sigmorphon/2022G2PST
    python scripts/shared_task.py g2p-2022-high --repo 2022G2PST --out runs/g2p-2022 --seconds 280 --jobs 2
    git clone https://github.com/sigmorphon/2023InflectionST
    python scripts/shared_task.py inflection-2023 --repo 2023InflectionST --out runs/inflection-2023 --seconds 240

g2p-2022-high is the SIGMORPHON 2022 grapheme-to-phoneme task's "high" subtask: ten languages of ~800 training words,
100 dev and 100 test words. Its repository ships the test words without their pronunciations, so charlm is scored on
the dev files, which are held out of everything else: each language trains on its training words, best.pt chosen on
a tenth of them (data.val_fraction), and only then is the dev file scored (word error rate: the share of words whose
predicted phones differ from the reference; the task's metric) and the test words transcribed into
OUT/LANG/predictions.tsv (word<TAB>phones, the format the task asks for). The baseline is the task's CLUZH system as
its README reports it, per language and macro-averaged.

inflection-2023 is the SIGMORPHON 2023 inflection task (part 1): 26 languages (27 sets: Hebrew also unvocalised) of
lemma<TAB>features<TAB>form files, 10,000 / 1,000 / 1,000 items split by lemma. Each language trains with
configs/inflection.yaml, best.pt chosen on the task's dev file as its protocol allows, then its test file is scored
(accuracy: the share of exactly right forms, the task's metric) and its covered test file (lemma<TAB>features) filled
in as OUT/LANG/predictions.tsv. The baseline is the task's own non-neural system (part1/baselines/nonneural.py, run
beside charlm on the same test file).
With --record TITLE the table goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import append_section, run_charlm, run_timed

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Task:
    """A shared task's files in its repository, its languages, how charlm trains on them and what it is scored by."""

    name: str
    url: str
    languages: tuple[str, ...]
    train: str  # paths inside the repository, {lang} filled in
    dev: str
    scored: str  # the file scored: the dev file where the task keeps the test answers, else the test file
    covered: str  # the sources to predict for a submission (the test file, or its covered version)
    config: str  # charlm's recipe for it
    sets: tuple[str, ...]  # settings per language; {dev} and {scored} are the files' paths
    metric: str  # "WER" (lower is better) or "accuracy" (higher is better), in %
    baseline: str  # whose figures the table sets beside charlm's
    published: dict[str, float] = field(default_factory=dict)  # the baseline's figures; empty: run it (run_baseline)


G2P_2022_HIGH = Task(
    name="g2p-2022-high",
    url="https://github.com/sigmorphon/2022G2PST",
    languages=("ben", "bur", "ger", "gle", "ita", "per", "swe", "tgl", "tha", "ukr"),
    train="data/target_languages/{lang}_train.tsv",
    dev="data/target_languages/{lang}_dev.tsv",
    scored="data/target_languages/{lang}_dev.tsv",
    covered="data/target_languages/{lang}_test.tsv",
    config="configs/g2p-shared.yaml",
    sets=("data.val_fraction=0.1", "data.test_fraction=0"),  # best.pt on a tenth of the training words
    metric="WER",
    baseline="CLUZH (the task's README, high subtask)",
    published={
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
INFLECTION_2023 = Task(
    name="inflection-2023",
    url="https://github.com/sigmorphon/2023InflectionST",
    languages=("afb", "amh", "arz", "bel", "dan", "deu", "eng", "fin", "fra", "grc", "heb", "heb_unvoc", "hun", "hye")
    + ("ita", "jap", "kat", "klr", "mkd", "nav", "rus", "san", "sme", "spa", "sqi", "swa", "tur"),
    train="part1/data/{lang}.trn",
    dev="part1/data/{lang}.dev",
    scored="part1/data/{lang}.tst",
    covered="part1/data/{lang}.covered.tst",
    config="configs/inflection.yaml",
    sets=("data.val_path={dev}", "data.test_path={scored}"),  # best.pt on the task's dev file
    metric="accuracy",
    baseline="the task's non-neural baseline",
)
TASKS = {task.name: task for task in (G2P_2022_HIGH, INFLECTION_2023)}


def run_language(
    task: Task,
    repo: Path,
    lang: str,
    out: Path,
    seconds: float,
    seed: int,
    extra: tuple[str, ...] = (),
    threads: int | None = None,
) -> dict:
    """Train on the language's training file, score the scored file, fill in the covered sources; the baseline's
    figure beside (published, or its script run on the same files). threads: torch's threads for each command
    (None: its own choice)."""
    env = None if threads is None else {"OMP_NUM_THREADS": str(threads)}
    files = {part: repo / getattr(task, part).format(lang=lang) for part in ("train", "dev", "scored", "covered")}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not found: is --repo a clone of {task.url}?")
    run = out / lang
    sets = [item.format(dev=files["dev"], scored=files["scored"]) for item in task.sets] + list(extra)
    train, wall = run_charlm(
        "train", "--config", str(ROOT / task.config), "--data", str(files["train"]),
        "--out-dir", str(run), "--overwrite", "--seed", str(seed), "--max-seconds", str(seconds),
        *(x for item in sets for x in ("--set", item)), env=env,
    )  # fmt: skip
    scored, _ = run_charlm("eval", str(run), "--data", str(files["scored"]), "--split", "all", env=env)
    sources = run / "sources.txt"  # each covered line without a target column: the word, or lemma<TAB>features
    columns = 1 if task.metric == "WER" else 2
    covered = ["\t".join(line.split("\t")[:columns]) + "\n" for line in read_lines(files["covered"])]
    sources.write_text("".join(covered), encoding="utf-8")
    sample = ["sample", str(run), "--prompt-file", str(sources), "--unknown", "replace"]  # the learned unknown symbol
    predicted, _ = run_timed([sys.executable, "-m", "charlm", *sample], env=env)
    (run / "predictions.tsv").write_text(predicted, encoding="utf-8")
    figure = 100 * (scored["word_error_rate"] if task.metric == "WER" else scored["exact_match"])
    baseline, baseline_wall = task.published.get(lang), 0.0
    if baseline is None:
        baseline, baseline_wall = run_baseline(repo, lang, files, out / "baseline" / lang)
    return {
        "lang": lang,
        "score": figure,
        "cer": 100 * scored["char_error_rate"],
        "baseline": baseline,
        "train_items": len(read_lines(files["train"])),
        "steps": train["steps"],
        "wall": wall,
        "baseline_wall": baseline_wall,
    }


def run_baseline(repo: Path, lang: str, files: dict[str, Path], folder: Path) -> tuple[float, float]:
    """The 2023 task's non-neural baseline on the scored file: its script scores LANG.dev of a folder (its -t option
    for the test file is not in its option list), so the folder holds the training file and the scored file under
    that name. Its accuracy in % and wall seconds."""
    script = repo / "part1" / "baselines" / "nonneural.py"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(files["train"], folder / f"{lang}.trn")
    shutil.copy(files["scored"], folder / f"{lang}.dev")
    started = time.perf_counter()
    out, _ = run_timed([sys.executable, str(script), "-p", f"{folder}/"])
    said = next((line for line in out.splitlines() if line.startswith(f"{lang}: ")), None)
    if said is None:
        raise SystemExit(f"{script} printed no '{lang}: ACCURACY' line:\n{out[-2000:]}")
    return 100 * float(said.split(": ")[1]), time.perf_counter() - started


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
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="languages trained at once, the cores shared out among them (a small model gains little from a "
        "second thread, so on 2 cores --jobs 2 halves the wall time)",
    )
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="on top of the recipe"
    )
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
    if args.jobs < 1:
        raise SystemExit(f"--jobs {args.jobs}: give 1 or more")
    threads = None if args.jobs == 1 else max(1, (os.cpu_count() or 1) // args.jobs)

    def one(lang: str) -> dict:
        result = run_language(task, args.repo, lang, args.out, args.seconds, args.seed, tuple(args.sets), threads)
        sys.stdout.write(json.dumps(result) + "\n")  # one write: two workers' lines never interleave
        sys.stdout.flush()
        return result

    pool = ThreadPoolExecutor(max_workers=args.jobs)  # each worker waits on its own charlm processes
    try:
        results = [future.result() for future in [pool.submit(one, lang) for lang in languages]]
    except BaseException:  # a language failed, or Ctrl-C: the languages not yet started never start
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    which = "dev" if task.scored == task.dev else "test"
    unit = "WER %" if task.metric == "WER" else "accuracy %"
    header = ["language", "training items", f"charlm {which} {unit}", f"charlm {which} CER %"]
    header += [f"{task.baseline} {which} {unit}", "steps", "wall s"]
    rows = [
        [r["lang"], f"{r['train_items']:,}", f"{r['score']:.2f}", f"{r['cer']:.2f}", f"{r['baseline']:.2f}"]
        + [f"{r['steps']:,}", f"{r['wall']:.0f}"]
        for r in results
    ]
    mean = [statistics.fmean(r[key] for r in results) for key in ("score", "cer", "baseline")]
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
