"""What a `charlm serve` request that leaves decoding options out gets: the model's sampling settings (the text
`charlm sample` prints for the same prompt and seed), listed by /v1/models and said at start-up, or OpenAI's defaults
under --generation-defaults openai."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli, skip_without
from serve_helpers import ServerProcess

from charlm.config.schema import SampleConfig
from charlm.decoding.options import DecodeOptions
from charlm.serving.requests import Limits, model_defaults

pytestmark = [
    pytest.mark.process,  # live `charlm serve` processes on loopback
    skip_without("openai", reason="the server tests use the openai client: pip install -e '.[test]'"),
    skip_without("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'"),
]

PROMPT = "ROMEO:"
# every setting away from its OpenAI default, so a server that fell back to one would answer otherwise
SAMPLE = {"temperature": 1.3, "top_k": 5, "top_p": 0.9, "max_new_tokens": 40}
AS_FIELDS = {"temperature": 1.3, "top_k": 5, "top_p": 0.9, "max_tokens": 40, "stop": []}
OPENAI: dict[str, object] = {"temperature": 1.0, "top_k": None, "top_p": 1.0, "max_tokens": 16, "stop": []}


@pytest.fixture(scope="module")
def tuned_export(tiny_checkpoint, tmp_path_factory):
    """The tests' small model exported, its config's sample section set to SAMPLE."""
    folder = tmp_path_factory.mktemp("tuned") / "export"
    run_cli("export", tiny_checkpoint, folder, check=True)
    config = json.loads((folder / "config.json").read_text())
    config["sample"] = SAMPLE
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def openai_client(server: ServerProcess):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def sampled(export, *flags: str) -> str:
    """`charlm sample`'s continuation of PROMPT with seed 5 (in this process, as a user runs it)."""
    result = run_cli("sample", export, "--prompt", PROMPT, "--seed", "5", *flags, "--json", check=True)
    return json.loads(result.stdout)["samples"][0][len(PROMPT) :]


@pytest.fixture(scope="module")
def server(tuned_export):
    process = ServerProcess(tuned_export)
    yield process
    process.stop()


def test_a_request_without_options_gets_the_text_charlm_sample_prints(tuned_export, server):
    served = openai_client(server).completions.create(model="charlm", prompt=PROMPT, seed=5).choices[0].text
    assert served == sampled(tuned_export)
    assert len(served) == SAMPLE["max_new_tokens"]
    # the model's top_k and top_p change this text: a server that left them out would fail the first assertion
    assert served != sampled(tuned_export, "--top-k", "1000", "--top-p", "1")
    said = server.process.stderr.readline()  # the start-up line after the API's address
    assert "get the model's sampling settings: temperature 1.3, top_k 5, top_p 0.9, max_tokens 40" in said, said


def test_models_lists_the_sampling_defaults(server):
    status, body = server.request("GET", "/v1/models")
    assert status == 200, body
    card = body["data"][0]
    assert card["generation_defaults"] == "model" and card["sampling_defaults"] == AS_FIELDS


def test_openai_defaults_give_16_characters_at_temperature_1(tuned_export):
    server = ServerProcess(tuned_export, "--generation-defaults", "openai")
    try:
        client = openai_client(server)
        served = client.completions.create(model="charlm", prompt=PROMPT, seed=5).choices[0].text
        assert len(served) == 16
        explicit = client.completions.create(
            model="charlm", prompt=PROMPT, seed=5, max_tokens=16, temperature=1, top_p=1, extra_body={"top_k": 1000}
        )  # top_k past the vocabulary: every character kept
        assert served == explicit.choices[0].text  # not the model's top_k 5, top_p 0.9 and temperature 1.3
        assert served != sampled(tuned_export, "--max-new-tokens", "16")  # which would read so
        status, body = server.request("GET", "/v1/models")
        card = body["data"][0]
        assert status == 200 and card["generation_defaults"] == "openai" and card["sampling_defaults"] == OPENAI
        said = server.process.stderr.readline()
        assert "get OpenAI's defaults: temperature 1, top_k none, top_p 1, max_tokens 16, no stop" in said, said
    finally:
        server.stop()


def test_the_models_max_new_tokens_is_held_within_max_tokens():
    options = DecodeOptions.from_config(SampleConfig(max_new_tokens=5000))
    held = model_defaults(options, Limits(max_tokens=4096))
    assert held.max_tokens == 4096 and "max_tokens 4096 (the model's 5000, capped by --max-tokens)" in held.sentence()
    assert model_defaults(options, Limits(max_tokens=8000)).max_tokens == 5000
