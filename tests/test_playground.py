"""The playground page in a real browser (the system's headless Chromium driven by Selenium) against a real
`charlm serve`: a prompt typed and generated (streamed), the sliders starting from the server's sampling defaults, the
score view and the attention view.

Set CHARLM_SCREENSHOT_DIR to save the pages as PNGs, and CHARLM_SCREENSHOT_MODEL to show another checkpoint than
the tests' small one (docs/playground*.png are made by scripts/make_pictures.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import skip_without
from serve_helpers import ServerProcess

pytestmark = [
    pytest.mark.process,  # a real browser against a real `charlm serve` process
    skip_without("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'"),
    skip_without("selenium", reason="the browser test drives Chromium with selenium"),
]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip(
        "no browser: the playground test needs the system's Chromium and its driver "
        "(Debian: apt-get install chromium chromium-driver; .ci/run installs them)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def server(request):
    """tiny_checkpoint served (tests/conftest.py: tests/test_serve.py talks to the same process, --max-tokens 500
    among its limits), or a server of its own for CHARLM_SCREENSHOT_MODEL."""
    if not os.environ.get("CHARLM_SCREENSHOT_MODEL"):
        yield request.getfixturevalue("tiny_server")
        return
    process = ServerProcess(Path(os.environ["CHARLM_SCREENSHOT_MODEL"]))
    yield process
    process.stop()


@contextlib.contextmanager
def headless_chromium(scratch: Path, window: str) -> Iterator[Any]:
    """The system's Chromium, headless, driven by Selenium, its window "WIDTH,HEIGHT" pixels. Its temporary files (a
    profile, a singleton socket) go under scratch rather than the machine's /tmp, where they would outlive the test."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={window}"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={scratch / 'profile'}")
    service = Service(executable_path=DRIVER, env={**os.environ, "TMPDIR": str(scratch)})
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with headless_chromium(tmp_path_factory.mktemp("chromium"), "1100,1000") as driver:
        yield driver


def wait_for(condition, timeout: float = 30.0, what: str = "the page"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def set_value(driver, element_id: str, value) -> None:
    """Set a slider or field as a person would leave it (the page listens to input events)."""
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];e.dispatchEvent(new Event('input'));",
        element_id,
        str(value),
    )


def screenshot(driver, name: str) -> None:
    folder = os.environ.get("CHARLM_SCREENSHOT_DIR")
    if folder:
        driver.save_screenshot(str(Path(folder) / name))


def test_generate_streams_the_continuation_into_the_page(server, browser):
    from selenium.webdriver.common.by import By as by

    browser.get(server.url + "/")
    wait_for(lambda: "layers" in browser.find_element(by.ID, "model-info").text, what="the model's description")
    prompt = browser.find_element(by.ID, "prompt")
    prompt.clear()
    prompt.send_keys("JULIET:")
    set_value(browser, "length", 500)  # the server's --max-tokens (tiny_server), far past the 16-character context
    set_value(browser, "temperature", 0.8)
    set_value(browser, "seed", 3)
    browser.execute_script(  # count the page's updates: a streamed text arrives in many
        "window.updates = 0; new MutationObserver(() => window.updates++).observe("
        "document.getElementById('continuation'), {childList: true, characterData: true, subtree: true});"
    )
    browser.find_element(by.ID, "generate").click()
    status = browser.find_element(by.ID, "generate-status")
    wait_for(lambda: "500 characters in" in status.text, what="the continuation to finish")
    text = browser.execute_script("return document.getElementById('continuation').textContent")
    assert len(text) == 500
    assert browser.execute_script("return window.updates") >= 10
    assert browser.find_element(by.ID, "output-prompt").text == "JULIET:"
    same = {"model": "charlm", "prompt": "JULIET:", "max_tokens": 500, "temperature": 0.8, "seed": 3}
    status, reply = server.request("POST", "/v1/completions", same)
    assert reply["choices"][0]["text"] == text  # the page sends its settings: the API's text for the same seed
    screenshot(browser, "playground.png")


def test_the_sliders_start_from_the_servers_sampling_defaults(server, browser):
    from selenium.webdriver.common.by import By as by

    browser.get(server.url + "/")
    info = browser.find_element(by.ID, "model-info")
    wait_for(lambda: "sliders" in info.text, what="the model's description with its sampling defaults")
    defaults = server.request("GET", "/v1/models")[1]["data"][0]["sampling_defaults"]
    shown = {name: browser.find_element(by.ID, name).get_attribute("value") for name in ("temperature", "length")}
    assert shown == {"temperature": f"{defaults['temperature']:g}", "length": str(defaults["max_tokens"])}
    assert f"the sliders start from the model's sampling settings (temperature {defaults['temperature']:g}" in info.text


def test_a_refused_prompt_shows_the_servers_message(server, browser):
    from selenium.webdriver.common.by import By as by

    browser.find_element(by.ID, "tab-generate").click()
    prompt = browser.find_element(by.ID, "prompt")
    prompt.clear()
    prompt.send_keys("日本")
    browser.find_element(by.ID, "generate").click()
    status = browser.find_element(by.ID, "generate-status")
    wait_for(lambda: "日" in status.text, what="the error message")
    assert "error" in status.get_attribute("class")


def test_score_view_colours_every_character(server, browser):
    from selenium.webdriver.common.by import By as by

    browser.find_element(by.ID, "tab-score").click()
    field = browser.find_element(by.ID, "score-text")
    assert field.is_displayed()
    text = "ROMEO:\nBut soft, what light"
    field.clear()
    field.send_keys(text)
    browser.find_element(by.ID, "score").click()
    wait_for(lambda: "bits/char" in browser.find_element(by.ID, "score-status").text, what="the scores")
    spans = browser.find_elements(by.CSS_SELECTOR, "#score-view span.scored")
    assert "".join(s.get_attribute("textContent") for s in spans) == text
    coloured = [s for s in spans if s.get_attribute("data-bits")]
    assert len(coloured) == len(text) - 1  # every character but the first, which has nothing before it
    assert all("bits" in s.get_attribute("title") for s in coloured)
    assert len({s.value_of_css_property("background-color") for s in coloured}) > 3  # surprise varies
    screenshot(browser, "playground-score.png")


def test_attention_view_draws_a_map_per_layer_and_head(server, browser):
    from selenium.webdriver.common.by import By as by

    browser.find_element(by.ID, "tab-attention").click()
    browser.find_element(by.ID, "attention").click()
    status = browser.find_element(by.ID, "attention-status")
    wait_for(lambda: "layer 0, head 0" in status.text, what="the attention map")
    _, info = server.request("GET", "/v1/models")
    layers = browser.find_elements(by.CSS_SELECTOR, "#layer option")
    heads = browser.find_elements(by.CSS_SELECTOR, "#head option")
    assert len(layers) == info["data"][0]["layers"] and len(heads) >= 1
    inked = "const c = document.getElementById('attn-canvas'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] < 200) n++; return n;"  # noqa: E501
    assert browser.execute_script(inked) > 100  # the map is drawn, not a blank canvas
    last = len(heads) - 1
    browser.execute_script(
        f"const s = document.getElementById('head'); s.value = {last}; s.dispatchEvent(new Event('change'));"
    )
    wait_for(lambda: f"head {last}" in status.text, what="the other head")
    screenshot(browser, "playground-attention.png")
