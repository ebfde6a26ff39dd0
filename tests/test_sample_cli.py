"""`charlm sample` as a user and a script meet it: a real subprocess on a real checkpoint."""

import json

import pytest
from conftest import assert_one_line_error, run_cli


def test_output_starts_with_the_prompt(tiny_checkpoint):
    result = run_cli(
        "sample", tiny_checkpoint, "--prompt", "JULIET:", "--seed", "1", "--max-new-tokens", "80", check=True
    )
    assert result.stdout.startswith("JULIET:") and len(result.stdout) >= 80


def test_same_seed_same_text(tiny_checkpoint):
    a, b, c = (
        run_cli("sample", tiny_checkpoint, "--seed", s, "--max-new-tokens", "60", check=True).stdout
        for s in ("5", "5", "6")
    )
    assert a == b != c


def test_num_samples_json_gives_that_many_samples(tiny_checkpoint):
    result = run_cli(
        "sample",
        tiny_checkpoint,
        "--num-samples",
        "3",
        "--json",
        "--max-new-tokens",
        "40",
        "--prompt",
        "ROMEO:",
        check=True,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert len(out["samples"]) == 3 and all(s.startswith("ROMEO:") for s in out["samples"])
    assert out["chars_per_s"] > 0


def test_temperature_zero_is_deterministic_without_a_seed(tiny_checkpoint):
    a, b = (
        run_cli("sample", tiny_checkpoint, "--temperature", "0", "--max-new-tokens", "50", check=True).stdout
        for _ in range(2)
    )
    assert a == b


def test_no_cache_reference_path_gives_the_same_greedy_text(tiny_checkpoint):
    args = ("sample", tiny_checkpoint, "--temperature", "0", "--max-new-tokens", "100", "--prompt", "KING:")
    assert run_cli(*args, check=True).stdout == run_cli(*args, "--no-cache", check=True).stdout


def test_stop_string_ends_the_sample_and_is_left_out(tiny_checkpoint):
    common = ("sample", tiny_checkpoint, "--prompt", "A", "--seed", "2", "--json")
    full = json.loads(run_cli(*common, check=True).stdout)["samples"][0]
    for stop in ("e", "e "):
        assert stop in full[1:], "the unstopped sample should hold the stop string"
        result = run_cli(*common, "--stop", stop, "--stop", "never-seen", check=True)
        assert json.loads(result.stdout)["samples"][0] == full[: full.index(stop, 1)]


def test_stream_prints_the_same_text(tiny_checkpoint):
    args = ("sample", tiny_checkpoint, "--seed", "3", "--max-new-tokens", "60", "--prompt", "Hi")
    assert run_cli(*args, "--stream", check=True).stdout == run_cli(*args, "--no-stream", check=True).stdout


def test_max_new_tokens_zero_prints_the_prompt(tiny_checkpoint):
    result = run_cli("sample", tiny_checkpoint, "--prompt", "JULIET:", "--max-new-tokens", "0", "--json", check=True)
    assert json.loads(result.stdout)["samples"] == ["JULIET:"]


def test_prompt_longer_than_the_context_works(tiny_checkpoint):
    long_prompt = "To be, or not to be, that is the question. " * 3  # > block_size 16
    result = run_cli("sample", tiny_checkpoint, "--prompt", long_prompt, "--max-new-tokens", "30", "--json", check=True)
    assert json.loads(result.stdout)["samples"][0].startswith(long_prompt)


def test_unknown_prompt_characters_follow_the_policy(tiny_checkpoint):
    assert_one_line_error(run_cli("sample", tiny_checkpoint, "--prompt", "caf\u00e9"), 2, "U+00E9", "--unknown")
    skipped = run_cli(
        "sample",
        tiny_checkpoint,
        "--prompt",
        "caf\u00e9",
        "--unknown",
        "skip",
        "--json",
        "--max-new-tokens",
        "5",
        check=True,
    )
    assert json.loads(skipped.stdout)["samples"][0].startswith("caf")
    replaced = run_cli(
        "sample",
        tiny_checkpoint,
        "--prompt",
        "caf\u00e9",
        "--unknown",
        "replace",
        "--json",
        "--max-new-tokens",
        "5",
        check=True,
    )
    assert json.loads(replaced.stdout)["samples"][0].startswith("caf ")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--temperature", "-1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--temperature", "inf"], "--temperature must be finite"),
        (["--temperature", "1e39"], "--temperature must be at most 10000"),  # past float32's range: uniform text
        (["--seed", "99999999999999999999"], "--seed must be between"),
        (["--top-p", "-0.1"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-k", "0"], "--top-k"),
        (["--max-new-tokens", "-5"], "--max-new-tokens"),
        (["--prompt", ""], "prompt"),
        (["--stop", ""], "--stop"),
    ],
)
def test_bad_arguments_are_one_clear_line(tiny_checkpoint, args, needle):
    assert_one_line_error(run_cli("sample", tiny_checkpoint, *args), 2, needle)


def test_missing_checkpoint_is_one_clear_line(tmp_path):
    assert_one_line_error(run_cli("sample", tmp_path / "nope.pt"), 2, "nope.pt")


def test_top_k_above_the_vocabulary_is_clamped(tiny_checkpoint):
    result = run_cli("sample", tiny_checkpoint, "--top-k", "1000", "--max-new-tokens", "20", "--json", check=True)
    assert len(json.loads(result.stdout)["samples"][0]) == 21
