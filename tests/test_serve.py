"""`charlm serve` as a real process on a loopback port, used through the real `openai` client and raw HTTP: the
OpenAI completions API (streaming, n, stop, seed, logprobs), scoring, attention, limits, keys and bad requests."""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading

import pytest
from conftest import assert_one_line_error, run_cli, skip_without
from serve_helpers import ServerProcess

pytestmark = [
    pytest.mark.process,  # every test here talks to a real `charlm serve` process over loopback HTTP
    skip_without("openai", reason="the server tests use the openai client: pip install -e '.[test]'"),
    skip_without("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'"),
]


def openai_client(url: str, api_key: str):
    """The openai package's client of a charlm server (imported here, where a test uses it)."""
    import openai

    return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0)


@pytest.fixture(scope="module")
def server(tiny_server):
    """tiny_checkpoint served with --max-tokens 500 --max-prompt 100 --max-n 8 --max-body 20000 (tests/conftest.py:
    tests/test_same_text.py and tests/test_playground.py talk to the same process)."""
    return tiny_server


@pytest.fixture(scope="module")
def client(server):
    return openai_client(f"{server.url}/v1", "x")


def test_openai_client_gets_exactly_max_tokens_characters(client):
    completion = client.completions.create(model="charlm", prompt="JULIET:", max_tokens=50)
    assert len(completion.choices[0].text) == 50
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 50 and completion.usage.prompt_tokens == len("JULIET:")


def test_streaming_arrives_in_many_chunks(client):
    chunks = list(client.completions.create(model="charlm", prompt="JULIET:", max_tokens=50, stream=True))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) >= 10  # character by character, not one block at the end
    assert len("".join(texts)) == 50
    assert chunks[-1].choices[0].finish_reason == "length"


def test_greedy_text_is_what_charlm_sample_prints(client, tiny_checkpoint):
    served = client.completions.create(model="charlm", prompt="ROMEO:", max_tokens=40, temperature=0)
    sampled = run_cli(
        "sample",
        tiny_checkpoint,
        "--prompt",
        "ROMEO:",
        "--temperature",
        "0",
        "--max-new-tokens",
        "40",
        "--no-stream",
        check=True,
    ).stdout
    assert sampled == "ROMEO:" + served.choices[0].text + "\n"


def test_prompts_times_n_and_a_seed_that_repeats(client):
    result = client.completions.create(model="charlm", prompt=["a", "b"], n=3, max_tokens=20, seed=7)
    assert sorted(c.index for c in result.choices) == list(range(6))
    again = client.completions.create(model="charlm", prompt=["a", "b"], n=3, max_tokens=20, seed=7)
    assert [c.text for c in sorted(result.choices, key=lambda c: c.index)] == [
        c.text for c in sorted(again.choices, key=lambda c: c.index)
    ]
    assert result.usage.completion_tokens == 6 * 20


def test_stop_string_ends_and_is_left_out(client):
    full = client.completions.create(model="charlm", prompt="JULIET:", max_tokens=200, temperature=0).choices[0].text
    stop = full[30:32]
    cut = client.completions.create(model="charlm", prompt="JULIET:", max_tokens=200, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]


def test_logprobs_per_character(client):
    result = client.completions.create(model="charlm", prompt="JULIET:", max_tokens=12, logprobs=3, seed=1)
    lp = result.choices[0].logprobs
    assert "".join(lp.tokens) == result.choices[0].text and len(lp.tokens) == 12
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(len(top) == 3 for top in lp.top_logprobs)
    assert all(sum(math.exp(v) for v in top.values()) <= 1 + 1e-6 for top in lp.top_logprobs)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        if token in top:  # the chosen character's figure is the same in both lists
            assert math.isclose(top[token], value, abs_tol=1e-5)


def test_models_lists_the_loaded_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["charlm"]


def test_score_gives_every_characters_surprisal(server, tiny_checkpoint):
    import charlm

    text = "ROMEO:\nBut soft"
    status, body = server.request("POST", "/v1/score", {"text": text})
    assert status == 200 and body["tokens"] == list(text)
    assert body["surprisal_bits"][0] is None and len(body["surprisal_bits"]) == len(text)
    mean_bits = sum(body["surprisal_bits"][1:]) / (len(text) - 1)
    assert math.isclose(mean_bits, body["bits_per_char"], rel_tol=1e-3)
    expected = charlm.load(tiny_checkpoint, "cpu").evaluate(text).loss
    assert math.isclose(body["nats_per_char"], expected, rel_tol=1e-4)


def test_attention_is_what_charlm_attention_json_gives(server, tiny_checkpoint):
    status, body = server.request("POST", "/v1/attention", {"prompt": "ROMEO: "})
    assert status == 200
    cli = json.loads(run_cli("attention", tiny_checkpoint, "--prompt", "ROMEO: ", "--json", check=True).stdout)
    assert body["chars"] == cli["chars"] and body["layers"] == cli["layers"] and body["heads"] == cli["heads"]
    for got, want in zip(json.dumps(body["weights"]).split(","), json.dumps(cli["weights"]).split(","), strict=True):
        assert math.isclose(float(got.strip("[] ")), float(want.strip("[] ")), abs_tol=1e-5)


def test_a_request_without_model_is_served_by_the_one_loaded_model(server, client):
    """vLLM and llama.cpp serve their one model when the field is left out; curl examples written for them work."""
    status, body = server.request("POST", "/v1/completions", {"prompt": "JULIET:", "max_tokens": 7, "temperature": 0})
    assert status == 200, body
    named = client.completions.create(model="charlm", prompt="JULIET:", max_tokens=7, temperature=0)
    assert body["model"] == "charlm" and body["choices"][0]["text"] == named.choices[0].text
    assert len(body["choices"][0]["text"]) == 7
    for path, payload in (("/v1/score", {"text": "JULIET: O"}), ("/v1/attention", {"prompt": "JULIET"})):
        status, body = server.request("POST", path, payload)
        assert status == 200, (path, body)


def test_health(server):
    status, body = server.request("GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["model"] == "charlm"


GOOD = {"model": "charlm", "prompt": "JULIET:", "max_tokens": 5}


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, 400, "nested too deeply"),  # Python's JSON decoder hits its recursion limit
        ([1, 2], 400, "JSON object"),
        ({**GOOD, "max_tokens": "50"}, 400, "max_tokens must be a whole number"),
        ({**GOOD, "max_tokens": 501}, 400, "max_tokens must be between 1 and 500"),
        ({**GOOD, "max_tokens": 0}, 400, "max_tokens must be between"),
        ({**GOOD, "temperature": -1}, 400, "temperature must be >= 0"),
        ({**GOOD, "temperature": True}, 400, "temperature must be a number"),
        ({**GOOD, "top_p": 1.5}, 400, "top_p must be between"),
        ({**GOOD, "top_k": 0}, 400, "top_k must be >= 1"),
        ({**GOOD, "n": 9}, 400, "n must be between 1 and 8"),
        ({**GOOD, "prompt": ["a"] * 3, "n": 3}, 400, "--max-n"),
        ({**GOOD, "prompt": "x" * 101}, 400, "--max-prompt"),
        ({**GOOD, "prompt": "日本"}, 400, "日"),
        ({**GOOD, "prompt": [1, 2, 3]}, 400, "prompt must be a string"),
        ({**GOOD, "prompt": ""}, 400, "prompt is empty"),
        ({**GOOD, "stop": ""}, 400, "stop must be"),
        ({**GOOD, "stream": "yes"}, 400, "stream must be true or false"),
        ({**GOOD, "seed": 1.5}, 400, "seed must be a whole number"),
        ({**GOOD, "seed": 2**64}, 400, "seed must be between -2**63 and 2**63 - 1"),
        ({**GOOD, "seed": 2**63 - 1, "n": 2}, 400, "seed + n - 1 must be at most 2**63 - 1"),  # choice 1: seed + 1
        ({**GOOD, "temperature": 1e39}, 400, "temperature must be at most 10000"),  # past float32: uniform text
        ({**GOOD, "temperature": float("nan")}, 400, "temperature must be a finite number"),
        ({**GOOD, "logprobs": 9}, 400, "logprobs must be between"),
        ({**GOOD, "echo": True}, 400, "echo is not supported"),
        ({**GOOD, "echo": 0}, 400, "echo must be a JSON boolean"),  # Python's 0 == False: the type is checked too
        ({**GOOD, "best_of": True}, 400, "best_of must be a JSON integer"),  # True == 1
        ({**GOOD, "frequency_penalty": False}, 400, "frequency_penalty must be a JSON number"),  # False == 0
        ({**GOOD, "logit_bias": []}, 400, "logit_bias must be a JSON object"),
        ({**GOOD, "user": 5}, 400, "user must be a string"),
        ({**GOOD, "stream_options": []}, 400, "stream_options must be"),
        ({**GOOD, "stream_options": 0}, 400, "stream_options must be"),
        ({**GOOD, "stream_options": False}, 400, "stream_options must be"),
        ({**GOOD, "stream_options": {"foo": 1}}, 400, "stream_options must be"),
        ({**GOOD, "frobnicate": 1}, 400, "unknown field 'frobnicate'"),
        ({**GOOD, "model": ""}, 400, "model must be the name GET /v1/models lists"),
        ({**GOOD, "model": 7}, 400, "model must be the name"),
        ({**GOOD, "model": "gpt-4"}, 404, "'gpt-4' is not served here"),
        (b"x" * 20001, 413, "--max-body"),
    ],
)
def test_bad_completion_request_is_refused_and_the_next_one_served(server, body, status, needle):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, reply = server.request("POST", "/v1/completions", raw=raw)
    assert got == status, reply
    assert needle in reply["error"]["message"] and "\n" not in reply["error"]["message"]
    assert reply["error"]["type"]
    ok, good = server.request("POST", "/v1/completions", GOOD)
    assert ok == 200 and len(good["choices"][0]["text"]) == 5


def test_openais_fields_at_their_neutral_values_are_served(server):
    """Fields charlm does not implement pass at the value that changes nothing, spelled with the type OpenAI gives."""
    neutral = {"echo": False, "best_of": 1, "frequency_penalty": 0.0, "presence_penalty": 0, "logit_bias": {}}
    extra = {"suffix": None, "user": "someone", "stream_options": {"include_obfuscation": False}, "seed": 2**63 - 2}
    extra["n"] = 2
    status, reply = server.request("POST", "/v1/completions", {**GOOD, **neutral, **extra})
    assert status == 200 and len(reply["choices"]) == 2, reply


def test_a_temperature_at_the_limit_still_obeys_top_k_and_top_p(server):
    greedy = server.request("POST", "/v1/completions", {**GOOD, "max_tokens": 30, "temperature": 0})[1]
    for narrow in ({"top_k": 1}, {"top_p": 0}):
        status, hot = server.request(
            "POST", "/v1/completions", {**GOOD, "max_tokens": 30, "temperature": 1e4, **narrow}
        )
        assert status == 200 and hot["choices"][0]["text"] == greedy["choices"][0]["text"], narrow


def test_a_prompt_refused_says_why_in_its_code(server):
    """The error's code tells a client's code what to fix: a character the model never saw, or an empty prompt."""
    for prompt, code in (("", "invalid_prompt"), ("日本", "unknown_character")):
        status, reply = server.request("POST", "/v1/completions", {**GOOD, "prompt": prompt})
        assert status == 400 and reply["error"]["code"] == code and reply["error"]["param"] == "prompt", reply


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "needle"),
    [
        ("POST", "/v1/score", {"text": "a"}, 400, "at least 2 characters"),
        ("POST", "/v1/score", {"text": "日本語"}, 400, "日"),
        ("POST", "/v1/score", {"txt": "abc"}, 400, "unknown field 'txt'"),
        ("POST", "/v1/attention", {"prompt": "x" * 60}, 400, "context"),
        ("POST", "/v1/attention", {"prompt": 5}, 400, "prompt must be a non-empty string"),
        # `model` as /v1/completions takes it: a wrong type or an empty name is a 400, a name not served a 404
        ("POST", "/v1/score", {"text": "abc", "model": 5}, 400, "model must be the name"),
        ("POST", "/v1/score", {"text": "abc", "model": ""}, 400, "model must be the name"),
        ("POST", "/v1/attention", {"prompt": "abc", "model": 5}, 400, "model must be the name"),
        ("POST", "/v1/attention", {"prompt": "abc", "model": ""}, 400, "model must be the name"),
        ("POST", "/v1/score", {"text": "abc", "model": "gpt-4"}, 404, "'gpt-4' is not served here"),
        ("POST", "/v1/attention", {"prompt": "abc", "model": "gpt-4"}, 404, "'gpt-4' is not served here"),
        ("GET", "/v1/nothing", None, 404, "the endpoints are"),
        ("GET", "/v1/completions", None, 405, "Method Not Allowed"),
    ],
)
def test_bad_requests_elsewhere(server, method, path, body, status, needle):
    got, reply = server.request(method, path, body)
    assert got == status and needle in reply["error"]["message"], reply
    assert server.request("GET", "/health")[0] == 200


def open_stream(server: ServerProcess, max_tokens: int, headers: dict | None = None) -> socket.socket:
    """Start a streaming completion on a raw socket and read its first event; return the socket."""
    sock = socket.create_connection((server.host, server.port), timeout=30)
    body = json.dumps({"model": "charlm", "prompt": "JULIET:", "max_tokens": max_tokens, "stream": True})
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    assert received.startswith(b"HTTP/1.1 200"), received
    return sock


@pytest.fixture(scope="module")
def small_server(tiny_checkpoint):
    """One row, one queued completion, a key, every address, and unknown characters read as 'e': the limits, the key
    and the replacement under test."""
    process = ServerProcess(
        tiny_checkpoint,
        "--max-batch",
        "1",
        "--max-queue",
        "1",
        "--max-n",
        "1",
        "--host",
        "0.0.0.0",
        "--unknown",
        "replace",
        "--replace-with",
        "e",
        env={"CHARLM_API_KEY": "sesame"},
    )
    process.host = "127.0.0.1"
    yield process
    process.stop()


KEY = {"Authorization": "Bearer sesame"}


def test_other_hosts_are_warned_about(small_server):
    assert "other machines can reach this server" in small_server.banner


def test_api_key_required_except_for_health_and_the_page(small_server):
    assert small_server.request("POST", "/v1/completions", GOOD)[0] == 401
    status, reply = small_server.request("POST", "/v1/completions", GOOD, {"Authorization": "Bearer wrong"})
    assert status == 401 and "wrong API key" in reply["error"]["message"]
    assert small_server.request("GET", "/v1/models")[0] == 401
    assert small_server.request("GET", "/health")[0] == 200
    assert small_server.request("GET", "/")[0] == 200
    assert small_server.request("POST", "/v1/completions", GOOD, KEY)[0] == 200
    client = openai_client(f"http://127.0.0.1:{small_server.port}/v1", "sesame")
    assert len(client.completions.create(model="charlm", prompt="a", max_tokens=3).choices[0].text) == 3


def test_full_queue_is_429_and_a_vanished_client_frees_its_row(small_server):
    running = open_stream(small_server, 400, KEY)  # takes the only row
    queued = socket.create_connection(("127.0.0.1", small_server.port))
    body = json.dumps({**GOOD, "max_tokens": 400})
    queued.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    for _ in range(100):  # until the second completion is waiting
        if small_server.request("GET", "/health")[1]["queued"] == 1:
            break
        threading.Event().wait(0.05)
    status, reply = small_server.request("POST", "/v1/completions", GOOD, KEY)
    assert status == 429 and "--max-queue" in reply["error"]["message"]
    running.close()  # both clients vanish mid-request
    queued.close()
    for _ in range(200):
        load = small_server.request("GET", "/health")[1]
        if load["running"] == 0 and load["queued"] == 0:
            break
        threading.Event().wait(0.05)
    assert load["running"] == 0 and load["queued"] == 0
    client = openai_client(f"http://127.0.0.1:{small_server.port}/v1", "sesame")
    assert len(client.completions.create(model="charlm", prompt="a", max_tokens=30).choices[0].text) == 30


def test_attention_reads_unknown_characters_as_the_servers_replacement(small_server):
    status, replaced = small_server.request("POST", "/v1/attention", {"prompt": "ROMEO日 b"}, KEY)
    assert status == 200 and replaced["chars"] == list("ROMEOe b")
    written = small_server.request("POST", "/v1/attention", {"prompt": "ROMEOe b"}, KEY)[1]
    assert replaced["weights"] == written["weights"]  # the weights of what the labels say, not of a space there


def test_concurrent_streams_all_complete_after_one_is_killed(server):
    killed = open_stream(server, 500)
    killed.close()
    results: list[str] = []

    def one() -> None:
        client = openai_client(f"{server.url}/v1", "x")
        stream = client.completions.create(model="charlm", prompt="JULIET:", max_tokens=60, stream=True)
        results.append("".join(c.choices[0].text for c in stream if c.choices))

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 16 and all(len(r) == 60 for r in results)


def test_a_taken_port_is_one_line(tiny_checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", tiny_checkpoint, "--port", str(port))
    assert_one_line_error(result, 2, f"cannot listen on 127.0.0.1:{port}", "--port")


def test_http_client_keeps_alive_across_requests(server):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    for _ in range(3):
        connection.request("POST", "/v1/completions", json.dumps(GOOD), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and len(json.loads(response.read())["choices"][0]["text"]) == 5
    connection.close()


def test_the_mailbox_delivers_everything_in_order_with_few_wake_ups():
    import asyncio

    from charlm.serving.server import Mailbox

    async def main():
        loop = asyncio.get_running_loop()
        mailbox, queues = Mailbox(loop), [asyncio.Queue(), asyncio.Queue()]
        wake_ups = 0
        deliver = mailbox._deliver

        def counted():
            nonlocal wake_ups
            wake_ups += 1
            deliver()

        mailbox._deliver = counted

        def engine():  # another thread, as the engine is: 2 x 2,000 events in bursts
            for i in range(2000):
                mailbox.post(queues[0], i)
                mailbox.post(queues[1], -i)

        thread = threading.Thread(target=engine)
        thread.start()
        got: list[list[int]] = [[], []]
        for q, out in zip(queues, got, strict=True):
            while len(out) < 2000:
                out.append(await asyncio.wait_for(q.get(), 10))
        thread.join()
        return got, wake_ups

    got, wake_ups = asyncio.run(main())
    assert got == [list(range(2000)), [-i for i in range(2000)]]
    assert wake_ups < 4000, wake_ups  # one per burst, not one per event
