"""One decoder everywhere: the same prompt, temperature, top-k, top-p and seed give the same text from `charlm
sample`, the Python API, the REPL read from a pipe and a live `charlm serve` (alone, and while another completion is
decoded beside it in the same batch); stop strings end the text the same way everywhere and are left out."""

from __future__ import annotations

import json
import threading

import pytest
from conftest import run_cli, skip_without
from serve_helpers import ServerProcess

import charlm

pytestmark = [
    pytest.mark.process,  # a live `charlm serve` process on loopback
    skip_without("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'"),
]

PROMPT = "ROMEO:"
SETTINGS = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 5, "max_new_tokens": 80}


def cli_flags(settings: dict) -> list[str]:
    flags = []
    for key, value in settings.items():
        if key == "stop":
            flags += [arg for stop in value for arg in ("--stop", stop)]
        else:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def from_cli(checkpoint, settings: dict) -> str:
    result = run_cli("sample", checkpoint, "--prompt", PROMPT, *cli_flags(settings), "--json", check=True)
    return json.loads(result.stdout)["samples"][0][len(PROMPT) :]


def from_api(checkpoint, settings: dict) -> str:
    return charlm.load(checkpoint).generate(PROMPT, **settings)[len(PROMPT) :]


def from_repl(checkpoint, settings: dict) -> str:
    """The REPL from a pipe prints each continuation after its prompt, a line per prompt."""
    result = run_cli("sample", checkpoint, "--interactive", *cli_flags(settings), input=PROMPT + "\n", check=True)
    assert result.stdout.startswith(PROMPT)
    return result.stdout[len(PROMPT) :].removesuffix("\n")


def body(settings: dict) -> dict:
    wire = {"max_tokens" if k == "max_new_tokens" else k: v for k, v in settings.items()}
    return {"model": "charlm", "prompt": PROMPT, **wire}


def from_server(server: ServerProcess, settings: dict) -> str:
    status, reply = server.request("POST", "/v1/completions", body(settings))
    assert status == 200, reply
    return reply["choices"][0]["text"]


def from_server_beside_another(server: ServerProcess, settings: dict) -> str:
    """Ours joins the running batch while a long completion with other settings is being decoded."""
    other = {"prompt": "JULIET:", "max_tokens": 400, "temperature": 1.1, "top_k": 3, "seed": 77, "stream": True}
    started, replies = threading.Event(), []

    def long_request() -> None:
        import http.client

        connection = http.client.HTTPConnection(server.host, server.port, timeout=120)
        connection.request("POST", "/v1/completions", json.dumps(other), {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.readline()  # the first streamed line: the long completion holds a row now
        started.set()
        replies.append(response.read())
        connection.close()

    thread = threading.Thread(target=long_request)
    thread.start()
    assert started.wait(120)
    status, load = server.request("GET", "/health")
    text = from_server(server, settings)
    thread.join(120)
    assert replies and b"[DONE]" in replies[0]
    assert status == 200 and load.get("running", 1) >= 1, load
    return text


@pytest.fixture(scope="module")
def server(tiny_server):
    """tiny_checkpoint served (tests/conftest.py): the process tests/test_serve.py talks to, in the same worker."""
    return tiny_server


def texts_everywhere(checkpoint, server, settings: dict) -> dict[str, str]:
    return {
        "charlm sample": from_cli(checkpoint, settings),
        "charlm.load().generate": from_api(checkpoint, settings),
        "the REPL from a pipe": from_repl(checkpoint, settings),
        "charlm serve": from_server(server, settings),
        "charlm serve beside another": from_server_beside_another(server, settings),
    }


def test_the_same_seed_gives_the_same_text_everywhere(tiny_checkpoint, server):
    texts = texts_everywhere(tiny_checkpoint, server, SETTINGS)
    assert len(set(texts.values())) == 1, texts
    assert len(texts["charlm sample"]) == SETTINGS["max_new_tokens"]


def test_a_stop_string_ends_the_text_the_same_way_everywhere(tiny_checkpoint, server):
    unstopped = from_cli(tiny_checkpoint, SETTINGS)
    stop = unstopped[40:43]  # three characters the sampled text holds; it ends before their first occurrence
    texts = texts_everywhere(tiny_checkpoint, server, {**SETTINGS, "stop": ["never in this text", stop]})
    assert len(set(texts.values())) == 1, texts
    assert texts["charlm sample"] == unstopped[: unstopped.index(stop)]
