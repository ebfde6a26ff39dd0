"""Sampling speed of ONNX exports (`charlm export --format onnx` / `--web`): characters per second through
onnxruntime (Python, batch 1) beside charlm's own torch sampler on the same model, alternating in one invocation,
with the export's time and folder size, then the web page's characters per second in headless Chromium.

    python scripts/bench_onnx.py                                   # the default shape and 6 x 384, prints figures
    python scripts/bench_onnx.py --tokens 50 --rounds 1 --shapes tiny   # a quick check that everything runs
    python scripts/bench_onnx.py --model runs/cpu                  # a trained decoder instead of the random ones
    python scripts/bench_onnx.py --runtime node_modules/onnxruntime-web/dist   # the page with this runtime copy
    python scripts/bench_onnx.py --record                          # and appends them to docs/benchmarks.md

Models: configs/cpu.yaml's shape (3 layers x 96, 3 heads, context 128, RoPE, SwiGLU, token shift) and
configs/gpu.yaml's (6 x 384, context 256), randomly initialised (torch.manual_seed(0)) over 65 characters, saved as
checkpoints and exported with --web; or --model checkpoints. Each timed run samples --tokens new characters from a
newline with seed 0 at temperature 1 (the same text through both runtimes, up to rounding); a warm-up of 20
characters comes first. The page is timed with temperature 1 and seed 0 too, the length rounded to its slider's
step of 10, reading the rate the page shows; it needs Chromium, chromedriver and selenium, and onnxruntime-web
(--runtime DIR, or an npm install into a temporary folder; the page is skipped, saying why, without them).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

SHAPES = {
    "default": ("cpu", []),
    "6x384": ("gpu", []),
    "tiny": ("tiny", ["model.token_shift=true", "model.pos_encoding=rope"]),  # for checking the script itself
}


def random_checkpoint(shape: str, folder: Path) -> Path:
    """A randomly initialised decoder of a shipped config's shape, saved as a checkpoint charlm can load."""
    import torch

    from charlm.config.build import load_config
    from charlm.data.tokenizer import CharTokenizer
    from charlm.families.registry import build_model
    from charlm.storage.checkpoint import save_checkpoint

    name, sets = SHAPES[shape]
    config = load_config(name, sets)
    config.model.dropout = 0.0
    tokenizer = CharTokenizer(["\n"] + [chr(c) for c in range(32, 96)])
    torch.manual_seed(0)
    model = build_model(config.model, tokenizer.vocab_size)
    path = folder / f"{shape}.pt"
    state = {"config": config.to_dict(), "vocab": tokenizer.chars, "model": model.state_dict(), "step": 0}
    save_checkpoint(path, state)
    return path


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def timed(model, tokens: int) -> float:
    """chars/s of one batch-1 sample of `tokens` characters, after a warm-up."""
    from charlm.decoding.options import DecodeOptions

    prompt = model.encode_prompt("\n")
    model.sample(prompt, DecodeOptions(max_new_tokens=20, temperature=1.0, seed=1))
    return model.sample(prompt, DecodeOptions(max_new_tokens=tokens, temperature=1.0, seed=0)).chars_per_s


def ort_runtime(given: str | None, tmp: Path) -> tuple[Path | None, str]:
    """onnxruntime-web's dist folder: --runtime, or an npm install into tmp; None and why where there is none."""
    if given:
        return Path(given), ""
    npm = shutil.which("npm")
    if not npm:
        return None, "no npm to install onnxruntime-web (give --runtime DIR)"
    from charlm.storage.web_export import ORT_WEB_VERSION

    done = subprocess.run([npm, "install", "--prefix", str(tmp / "npm"), "--no-audit", "--no-fund",
                           f"onnxruntime-web@{ORT_WEB_VERSION}"], capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        return None, "npm install onnxruntime-web failed: " + (done.stderr.strip().splitlines() or [""])[-1]
    return tmp / "npm" / "node_modules" / "onnxruntime-web" / "dist", ""


def page_rate(folder: Path, tokens: int) -> tuple[float | None, str]:
    """chars/s the exported page reports in headless Chromium (temperature 1, seed 0), or None and why not."""
    chromium, driver_path = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None, "no selenium"
    if not (chromium and driver_path):
        return None, "no Chromium and chromedriver"

    class Quiet(http.server.SimpleHTTPRequestHandler):
        extensions_map: ClassVar = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                                    ".wasm": "application/wasm"}  # fmt: skip

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        status = "return document.getElementById('generate-status')"
        if not wait(lambda: browser.execute_script(status + ".textContent") == "ready", 120):
            return None, "the page did not load: " + browser.execute_script(status + ".textContent")
        length = max(10, round(tokens / 10) * 10)
        browser.execute_script(
            "for (const [id, v] of [['length', arguments[0]], ['temperature', 1], ['seed', 0]]) {"
            "const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event('input')); }"
            "document.getElementById('generate').click();",
            length,
        )
        if not wait(lambda: browser.execute_script(status + ".dataset.charsPerS"), 600):
            return None, "the page did not finish: " + browser.execute_script(status + ".textContent")
        return float(browser.execute_script(status + ".dataset.charsPerS")), ""
    finally:
        browser.quit()
        server.shutdown()


def wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1000, help="new characters per timed run")
    parser.add_argument("--rounds", type=int, default=3, help="torch and onnxruntime runs, alternating")
    parser.add_argument("--shapes", default="default,6x384", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--model", action="append", default=[], help="a trained decoder to time (repeatable)")
    parser.add_argument("--runtime", help="onnxruntime-web's dist folder for the page (default: npm install it)")
    parser.add_argument("--no-browser", action="store_true", help="leave out the page in Chromium")
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.md")
    args = parser.parse_args()

    import charlm

    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        runtime, why_not = (None, "--no-browser") if args.no_browser else ort_runtime(args.runtime, tmp)
        models = [(m, Path(m)) for m in args.model] or [
            (s, random_checkpoint(s, tmp)) for s in args.shapes.split(",") if s
        ]
        for name, checkpoint in models:
            folder = tmp / f"export-{len(rows)}"
            # The export runs in a process of its own, so that the timed process has never traced anything.
            command = [sys.executable, "-m", "charlm", "export", str(checkpoint), str(folder), "--web"]
            started = time.perf_counter()
            done = subprocess.run(command + (["--runtime", str(runtime)] if runtime else []), capture_output=True,
                                  text=True, cwd=ROOT)  # fmt: skip
            seconds = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"charlm export failed:\n{done.stderr[-2000:]}")
            check = json.loads((folder / "config.json").read_text())["onnx"]["check"]
            size = folder_size(folder) - (folder_size(folder / "ort") if (folder / "ort").exists() else 0)
            print(f"{name}: exported in {seconds:.1f} s (graphs, their check and the model card), {size / 1e6:.2f} MB "
                  f"without the runtime; max |logit difference| {check['max_abs_diff']:.2g}", flush=True)  # fmt: skip
            torch_model, onnx_model = charlm.load(checkpoint, "cpu"), charlm.load(folder)
            rates: dict[str, list[float]] = {"torch": [], "onnxruntime": []}
            for round_ in range(args.rounds):
                for runtime_name, model in (("torch", torch_model), ("onnxruntime", onnx_model)):
                    rates[runtime_name].append(timed(model, args.tokens))
                    print(f"{name} round {round_ + 1}: {runtime_name:12s} {rates[runtime_name][-1]:9.1f} chars/s",
                          flush=True)  # fmt: skip
            page, why = page_rate(folder, args.tokens) if runtime is not None else (None, why_not)
            print(f"{name}: the page in headless Chromium " + (f"{page:.1f} chars/s" if page else f"not timed ({why})"))
            each = {k: " / ".join(f"{v:,.0f}" for v in values) for k, values in rates.items()}
            rows.append([
                name,
                f"**{statistics.median(rates['torch']):,.0f}** ({each['torch']})",
                f"**{statistics.median(rates['onnxruntime']):,.0f}** ({each['onnxruntime']})",
                f"{page:,.0f}" if page else f"– ({why})",
                f"{seconds:.1f}",
                f"{size / 1e6:.2f}",
                f"{check['max_abs_diff']:.1g}",
            ])  # fmt: skip
    header = ["model", "torch chars/s (each)", "onnxruntime chars/s (each)", "page chars/s (Chromium)", "export s",
              "folder MB", "max logit diff"]  # fmt: skip
    for row in rows:
        print(" | ".join(row))
    if args.record and rows:
        from benchlib import append_section

        append_section(f"ONNX exports: batch-1 sampling, {args.tokens} characters", header, rows)


if __name__ == "__main__":
    main()
