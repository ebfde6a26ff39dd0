"""`charlm export --web` in a real browser: the system's headless Chromium (driven by Selenium, as
tests/test_playground.py drives it) opens the page from a static file server on 127.0.0.1, with onnxruntime-web
installed by npm into the test's own folder and bundled by --runtime. Greedy text equals `charlm sample
--temperature 0`; a seed repeats its text; a missing model file is one line on the page.

Set CHARLM_SCREENSHOT_DIR to save the page as a PNG, and CHARLM_SCREENSHOT_MODEL to show another checkpoint than
the tests' small one (docs/web-page.png is made by scripts/make_pictures.py).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import run_cli, skip_without, train_cli

pytestmark = [
    pytest.mark.process,  # a real browser, a real server and npm
    skip_without("onnxruntime", reason="ONNX exports need the onnx extra: pip install -e '.[test]'"),
    skip_without("selenium", reason="the browser test drives Chromium with selenium"),
]

from charlm.storage.web_export import CDN, ORT_WEB_VERSION, RUNTIME_FILES, write_page  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
NPM = shutil.which("npm")
if not (CHROMIUM and DRIVER):
    pytest.skip(
        "no browser: the web page test needs the system's Chromium and its driver "
        "(Debian: apt-get install chromium chromium-driver; .ci/run installs them)",
        allow_module_level=True,
    )
if not NPM:
    pytest.skip("no npm: the web page test installs onnxruntime-web with npm (Debian: apt-get install npm)",
                allow_module_level=True)  # fmt: skip

from test_playground import headless_chromium, screenshot, set_value, wait_for  # noqa: E402  (browser helpers)

PROMPT = "JULIET:\n"
# The default recipe's options at a small width: RoPE (a rolling window), SwiGLU, token shift, 3 heads.
RECIPE = ["--config", "cpu", "--set", "train.max_seconds=0", "--set", "model.n_layer=2", "--set", "model.n_embd=48"]
RECIPE += ["--set", "model.block_size=24", "--set", "train.eval_interval=20", "--set", "train.eval_windows=8"]


@pytest.fixture(scope="module")
def ort_dist(tmp_path_factory) -> Path:
    """onnxruntime-web's dist folder, installed by npm into this module's own folder (no global install)."""
    prefix = tmp_path_factory.mktemp("npm")
    try:
        done = subprocess.run(
            [NPM, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"onnxruntime-web@{ORT_WEB_VERSION}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install onnxruntime-web took over 10 minutes (is the npm registry reachable?)")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"npm install onnxruntime-web@{ORT_WEB_VERSION} failed (the registry may be unreachable): {last}")
    return prefix / "node_modules" / "onnxruntime-web" / "dist"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, corpus) -> Path:
    if os.environ.get("CHARLM_SCREENSHOT_MODEL"):
        return Path(os.environ["CHARLM_SCREENSHOT_MODEL"])
    run = tmp_path_factory.mktemp("web-run") / "run"
    run_cli(*train_cli(corpus, run, steps=40, quiet=True, config=RECIPE), check=True)
    return run / "best.pt"


@pytest.fixture(scope="module")
def site(tmp_path_factory, checkpoint, ort_dist):
    """The exported page on a static file server (python's http.server) on 127.0.0.1: its root URL, its folder."""
    root = tmp_path_factory.mktemp("site")
    run_cli("export", checkpoint, root / "page", "--web", "--runtime", ort_dist, check=True)
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=lambda: server.serve_forever(poll_interval=0.05), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", root
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map: ClassVar = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                                ".wasm": "application/wasm"}  # fmt: skip

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with headless_chromium(tmp_path_factory.mktemp("chromium"), "1100,900") as driver:
        yield driver


def status(browser) -> str:
    return browser.execute_script("return document.getElementById('generate-status').textContent")


def generate(browser, prompt: str, length: int, **settings: object) -> str:
    """Type a prompt, set the controls, press Generate; the continuation once it has finished."""
    from selenium.webdriver.common.by import By as by

    field = browser.find_element(by.ID, "prompt")
    field.clear()
    field.send_keys(prompt)
    set_value(browser, "length", length)
    for name, value in settings.items():
        set_value(browser, name.replace("_", "-"), value)
    browser.find_element(by.ID, "generate").click()
    wait_for(lambda: "characters in" in status(browser) or "error" in _classes(browser), 120, "the continuation")
    assert "error" not in _classes(browser), status(browser)
    return browser.execute_script("return document.getElementById('continuation').textContent")


def _classes(browser) -> str:
    return browser.execute_script("return document.getElementById('generate-status').className")


def open_page(browser, url: str) -> None:
    browser.get(url)
    wait_for(lambda: status(browser) in ("ready",) or "error" in _classes(browser), 60, "the model to load")


def test_greedy_text_in_the_browser_is_charlm_samples(site, browser, checkpoint):
    url, _ = site
    open_page(browser, url + "page/index.html")
    assert status(browser) == "ready", status(browser)
    browser.execute_script(  # count the page's updates: a streamed text arrives in many
        "window.updates = 0; new MutationObserver(() => window.updates++).observe("
        "document.getElementById('continuation'), {childList: true, characterData: true, subtree: true});"
    )
    text = generate(browser, PROMPT, 300, temperature=0)
    assert browser.execute_script("return window.updates") >= 10
    reference = run_cli("sample", checkpoint, "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "300",
                        "--json", check=True)  # fmt: skip
    assert PROMPT + text == json.loads(reference.stdout)["samples"][0]
    assert "300 characters in" in status(browser) and "chars/s" in status(browser)


def test_a_byte_model_with_learned_positions_jumps_its_window_as_charlm_does(site, browser, corpus, tmp_path):
    """Absolute positions re-encode the last half of the context when the text outgrows it (the page's window
    policy is charlm's), and a byte model's bytes are decoded into whole characters."""
    url, root = site
    config = [*RECIPE, "--set", "model.pos_encoding=learned", "--set", "model.token_shift=false"]
    config += ["--set", "data.tokenizer=byte", "--set", "model.block_size=16"]
    run_cli(*train_cli(corpus, tmp_path / "run", steps=60, quiet=True, config=config), check=True)
    run_cli("export", tmp_path / "run", root / "bytes", "--web", "--runtime", root / "page" / "ort", check=True)
    open_page(browser, url + "bytes/index.html")
    assert "byte values" in browser.find_element("id", "model-info").text
    text = generate(browser, PROMPT, 200, temperature=0)
    reference = run_cli("sample", tmp_path / "run", "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens",
                        "200", "--json", check=True)  # fmt: skip
    assert PROMPT + text == json.loads(reference.stdout)["samples"][0]


def test_a_seed_repeats_its_sampled_text_in_the_page(site, browser):
    url, _ = site
    open_page(browser, url + "page/index.html")
    settings = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7}
    first = generate(browser, "ROMEO:", 200, **settings)
    screenshot(browser, "web-page.png")
    assert generate(browser, "ROMEO:", 200, **settings) == first
    assert generate(browser, "ROMEO:", 200, **{**settings, "seed": 8}) != first
    stopped = generate(browser, "ROMEO:", 200, **settings, stop_at=first[50:53])
    assert stopped == first[:50] or len(stopped) < 50  # ends just before the first occurrence of the stop string


def test_a_page_without_its_model_says_so_in_one_line(site, browser):
    url, root = site
    broken = root / "broken"
    shutil.copytree(root / "page", broken)
    (broken / "model.onnx").unlink()
    open_page(browser, url + "broken/index.html")
    assert "error" in _classes(browser)
    assert "model.onnx is missing" in status(browser) and "\n" not in status(browser)
    assert not browser.find_element("id", "generate").is_enabled()


def test_the_page_names_a_pinned_public_runtime_unless_one_is_bundled(site, tmp_path):
    _, root = site
    bundled = (root / "page" / "index.html").read_text()
    assert 'src="ort/ort.wasm.min.js"' in bundled and all((root / "page" / "ort" / f).is_file() for f in RUNTIME_FILES)
    (tmp_path / "cdn").mkdir()
    write_page(tmp_path / "cdn", None)  # what `charlm export --web` without --runtime writes beside the graph
    page = (tmp_path / "cdn" / "index.html").read_text()
    assert f'src="{CDN}ort.wasm.min.js"' in page and "@" + ORT_WEB_VERSION in CDN and "{{" not in page
    assert not (tmp_path / "cdn" / "ort").exists()
