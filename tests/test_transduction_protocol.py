"""Transduction measured as the field measures it: every reference of a source counts, a source's lines stay on one
side of the split, and characters the model never saw are read as a learned unknown symbol when asked."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, assert_resume_is_exact, run_cli, train_cli
from test_encdec import SHAPE

import charlm
from charlm.config.build import load_config
from charlm.data.pairs import PairBatches, PairCorpus
from charlm.data.records import SPLIT_SEED
from charlm.data.tokenizer import UNKNOWN_CHAR, restore_unknown
from charlm.decoding.options import DecodeOptions
from charlm.decoding.rewrite import rewrite
from charlm.errors import UsageError
from charlm.evaluation.transduction import error_rates, score_pairs
from charlm.models.encoder_decoder import EncoderDecoder

COPY_STEPS = 300  # the tiny shape copies words of a-h, the unknown symbol among them, by then (seeds 1-7 tried)


def test_a_hypothesis_matching_only_the_second_reference_is_right():
    rates = error_rates([["R EH D", "R IY D"]], ["R IY D"])
    assert rates["word_error_rate"] == 0.0 and rates["token_error_rate"] == 0.0
    near = error_rates([["K AE T", "R IY D Z"]], ["R IY D"])  # wrong, and closest to the second reference
    assert near["word_error_rate"] == 1.0
    assert near["token_error_rate"] == pytest.approx(1 / 4)  # R IY D Z: 1 edit of 4 (K AE T: 3 of 3)
    assert near["char_error_rate"] == pytest.approx(2 / 8)  # " Z" missing from the 8 characters of R IY D Z
    tie = error_rates([["R EH D", "R IY D Z"]], ["R IY D"])  # one token from either: the shorter is taken
    assert tie["token_error_rate"] == pytest.approx(1 / 3)


def test_a_written_unknown_symbol_gives_back_the_sources_unseen_characters_in_order():
    U = UNKNOWN_CHAR
    assert restore_unknown(f"b{U}{U}a", "zy") == "bzya"
    assert restore_unknown(f"{U}x{U}{U}", "z") == "zxzz"  # written more often than the source had: the last again
    assert restore_unknown(f"b{U}a", "") == f"b{U}a"  # nothing unseen in the source: nothing to give back
    assert restore_unknown("bza", "q") == "bza"


def reversed_batches(tmp_path: Path) -> tuple[Path, PairBatches, int]:
    """Training batches of words and their reversals with data.unknown_dropout 0.3: the file, the batches and the
    unknown symbol's id."""
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{w}\t{w[::-1]}\n" for w in ("abcd", "bcad", "cabbd", "dda", "acdb") * 40))
    config = load_config("tiny", [*SHAPE[1::2], f"data.path={data}", "data.unknown_dropout=0.3"])
    corpus = PairCorpus.from_config(config.data, config.model.block_size)
    unk = corpus.tokenizer.stoi[UNKNOWN_CHAR]
    batches = PairBatches(corpus.train, 32, torch.device("cpu"), 0, unk, 0.3)
    return data, batches, unk


def test_unknown_dropout_reads_a_character_as_the_symbol_in_source_and_target_alike(tmp_path):
    """Each target is its source reversed: after the dropout it still is, symbol for symbol, so every character read
    as the unknown symbol in a source was read so in its target too (where the model learns to copy it)."""
    _, batches, unk = reversed_batches(tmp_path)
    dropped = 0
    for _ in range(5):
        (src, tgt_in), targets = batches.next_batch()
        for row in range(src.size(0)):
            source = src[row][src[row] != 0].tolist()
            target = targets[row][targets[row] >= 0].tolist()[:-1]  # without the end symbol
            assert target == source[::-1]
            assert tgt_in[row][1 : len(target) + 1].tolist() == target  # the decoder's input: the same target
            dropped += source.count(unk)
    assert dropped > 0


def test_score_pairs_groups_a_sources_lines_and_keeps_the_line_by_line_figures(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("abc\tcba\nbca\tacb\n")
    config = load_config("tiny", [*SHAPE[1::2], f"data.path={data}"])
    corpus = PairCorpus.from_config(config.data, config.model.block_size)
    torch.manual_seed(0)
    model = EncoderDecoder(config.model, corpus.tokenizer.vocab_size)
    options = DecodeOptions(temperature=0.0, max_new_tokens=8)
    sources = [corpus.tokenizer.encode(s) for s in ("abc", "bca")]
    hypotheses = [corpus.tokenizer.decode(h) for h in rewrite(model, sources, options)]
    assert all(hypotheses), "an untrained model still writes something before its end symbol"
    encode = corpus.tokenizer.encode
    wrong = {h: "".join(sorted(set("abc") - set(h[:1]))) or "a" for h in hypotheses}
    # each source twice: first a reference the model did not write, then the one it did
    pairs = [(s, encode(t)) for s, h in zip(sources, hypotheses, strict=True) for t in (wrong[h], h)]
    result = score_pairs([model], corpus.tokenizer.decode, pairs, lambda s: rewrite(model, s, options))
    assert (result.sources, result.lines) == (2, 4)
    assert result.word_error_rate == 0.0 and result.exact_match == 1.0
    assert result.single_reference["word_error_rate"] == 0.5 and result.single_reference["lines"] == 4


def test_a_sources_lines_stay_on_one_side_and_unique_sources_split_as_before(tmp_path):
    r = random.Random(1)
    words = sorted({"".join(r.choice("abcdef") for _ in range(6)) for _ in range(300)})
    alternates = tmp_path / "alternates.tsv"
    alternates.write_text("".join(f"{w}\t{w[::-1]}\n{w}\t{w.upper()}\n" for w in words))
    config = load_config("tiny", [*SHAPE[1::2], f"data.path={alternates}", "data.val_size=30", "data.test_size=30"])
    corpus = PairCorpus.from_config(config.data, config.model.block_size)
    sides = [{tuple(s) for s, _ in corpus.split(name)} for name in ("train", "val", "test")]
    assert [len(side) for side in sides] == [len(words) - 60, 30, 30]  # sizes count sources
    assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
    assert len(corpus.split("test")) == 60  # both lines of each test word

    unique = tmp_path / "unique.tsv"
    unique.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    config = load_config("tiny", [*SHAPE[1::2], f"data.path={unique}"])
    corpus = PairCorpus.from_config(config.data, config.model.block_size)
    lines = [(corpus.tokenizer.encode(w), corpus.tokenizer.encode(w[::-1])) for w in words]
    random.Random(SPLIT_SEED).shuffle(lines)  # the split of every pairs run before sources were grouped
    assert corpus.train + corpus.val == lines


@pytest.fixture(scope="module")
def unknown_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("unknown")
    r = random.Random(0)
    words = ["".join(r.choice("abcdefgh") for _ in range(r.randint(3, 6))) for _ in range(3000)]
    data = folder / "train.tsv"
    data.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    sets = {"data.unknown_dropout": 0.1, "train.eval_interval": 1000}
    result = run_cli(*train_cli(data, folder / "run", steps=60, config=["--config", "tiny", *SHAPE], sets=sets))
    assert result.returncode == 0, result.stderr
    return folder / "run"


def test_unseen_characters_are_read_as_the_learned_unknown_symbol(unknown_run, tmp_path):
    model = charlm.load(unknown_run)
    assert UNKNOWN_CHAR in model.tokenizer.chars  # data.unknown_dropout put it in the vocabulary
    ids = model.encode_source("abzd", "replace")
    assert ids[2] == model.tokenizer.stoi[UNKNOWN_CHAR]
    assert len(model.transduce("abzd", unknown="replace")) >= 3

    test = tmp_path / "test.tsv"
    test.write_text("abc\tcba\nazzb\tbzza\ncdh\thdc\nayyb\tbyya\n")  # azzb and ayyb read alike: two words still
    refused = run_cli("eval", unknown_run, "--data", test, "--unknown", "error")
    assert_one_line_error(refused, 2, "'z' (U+007A)", "--unknown replace")
    # A model with the learned symbol reads them as it by default, as --unknown replace does.
    for asked in ([], ["--unknown", "replace"]):
        scored = run_cli("eval", unknown_run, "--data", test, *asked, "--json")
        assert scored.returncode == 0, scored.stderr
        figures = json.loads(scored.stdout)
        counts = ("unknown_chars", "unknown_lines", "unknown_target_lines", "lines", "sources")
        assert [figures[k] for k in counts] == [8, 2, 2, 4, 4]
        assert figures["file"] == str(test)
    said = run_cli("eval", unknown_run, "--data", test, check=True)
    assert "2 lines of" in said.stderr and "8 such characters replaced" in said.stderr
    assert "2 lines of" in said.stderr and "have a target character the model never saw" in said.stderr
    skipped = json.loads(run_cli("eval", unknown_run, "--data", test, "--unknown", "skip", "--json").stdout)
    assert (skipped["lines"], skipped["unknown_lines"]) == (2, 2)

    words = tmp_path / "words.txt"
    words.write_text("abc\nazzb\n")
    sampled = run_cli("sample", unknown_run, "--prompt-file", words, "--unknown", "replace")
    assert sampled.returncode == 0, sampled.stderr
    assert "2 characters the model never saw, in 1 of 2 sources, read as the unknown symbol" in sampled.stderr
    assert [line.split("\t")[0] for line in sampled.stdout.splitlines()] == ["abc", "azzb"]


def test_a_model_copies_a_character_it_never_saw_into_its_target(tmp_path):
    """Trained to copy words of a-h with data.unknown_dropout, the model writes the unknown symbol where a character
    it cannot read goes, and decoding puts that character back: the API, sample and eval give the word itself."""
    r = random.Random(1)
    words = ["".join(r.choice("abcdefgh") for _ in range(r.randint(3, 6))) for _ in range(2000)]
    data = tmp_path / "train.tsv"
    data.write_text("".join(f"{w}\t{w}\n" for w in words))
    sets = {"data.unknown_dropout": 0.2, "train.eval_interval": 1000}
    run = tmp_path / "run"
    run_cli(*train_cli(data, run, steps=COPY_STEPS, config=["--config", "tiny", *SHAPE], sets=sets), check=True)
    model = charlm.load(run)
    abzd, hqqa = model.rewrite(["abzd", "hqqa"], unknown="replace")
    # What any model that learned to copy does (the letters it reads it may still miscopy now and then): the unseen
    # characters come back where they stood, and no unknown symbol is left in what it writes.
    assert abzd.startswith("abz") and hqqa.startswith("hqq") and UNKNOWN_CHAR not in abzd + hqqa
    assert "z" not in model.rewrite(["abzd"], unknown="replace", replace_with="c")[0]  # no symbol stood in: no copy
    test = tmp_path / "test.tsv"
    test.write_text("abzd\tabzd\nhqqa\thqqa\nhqqa\thqa\n")
    figures = json.loads(run_cli("eval", run, "--data", test, "--json", check=True).stdout)
    # Scored against the file's own text, line by line for a replaced source (two words may read alike once
    # replaced): right where what the model writes, copies put back, is the reference.
    right = [abzd == "abzd", hqqa == "hqqa", hqqa == "hqa"]
    assert (figures["unknown_target_lines"], figures["exact_match"]) == (3, pytest.approx(sum(right) / 3))
    words_file = tmp_path / "words.txt"
    words_file.write_text("abzd\n")
    sampled = run_cli("sample", run, "--prompt-file", words_file, "--unknown", "replace", check=True)
    assert sampled.stdout.splitlines() == [f"abzd\t{abzd}"]


def test_unknown_dropout_draws_from_the_batches_generator_and_resumes_exactly(tmp_path):
    data, batches, unk = reversed_batches(tmp_path)
    (src, _), _ = batches.next_batch()
    share = (src == unk).sum() / (src != 0).sum()
    assert 0.15 < share < 0.45
    common = ["train", "--config", "tiny", *SHAPE, "--data", data, "--set", "data.unknown_dropout=0.2"]
    common += ["--set", "train.eval_interval=3", "--set", "train.log_interval=1"]  # every step's loss compared
    assert_resume_is_exact(common, tmp_path, steps=12)


def test_unknown_dropout_is_for_pairs():
    with pytest.raises(UsageError, match="data.unknown_dropout .* is for data.format pairs"):
        load_config("tiny", ["data.unknown_dropout=0.1"])


@pytest.fixture(scope="module")
def refusing(unknown_run):
    """`charlm serve` of unknown_run with its defaults (an unseen character refused) and a queue of one request
    (below --max-n: that queue counts requests, not rows): one process for both server tests below."""
    pytest.importorskip("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'")
    from serve_helpers import ServerProcess

    server = ServerProcess(unknown_run, "--max-queue", "1")
    yield server
    server.stop()


def test_charlm_serve_rewrites_sources_and_reads_unseen_characters_as_the_unknown_symbol(unknown_run, refusing):
    openai = pytest.importorskip("openai", reason="the server tests use the openai client: pip install -e '.[test]'")
    from serve_helpers import ServerProcess

    expected = charlm.load(unknown_run).transduce(["abcd", "azzb"], unknown="replace")
    replacing = ServerProcess(unknown_run, "--unknown", "replace")
    try:
        client = openai.OpenAI(base_url=f"{replacing.url}/v1", api_key="x", max_retries=0)
        completion = client.completions.create(model="charlm", prompt=["abcd", "azzb"], temperature=0)
        assert [c.text for c in completion.choices] == expected  # the same targets as charlm.load(...).transduce
        assert all(c.finish_reason == "stop" for c in completion.choices)
        assert completion.usage.unknown_characters == 2
        seeded = [
            client.completions.create(model="charlm", prompt="abcdef", temperature=1, seed=5).choices[0].text
            for _ in "ab"
        ]
        assert seeded[0] == seeded[1] == charlm.load(unknown_run).transduce("abcdef", temperature=1.0, seed=5)
        status, body = refusing.request("POST", "/v1/completions", {"prompt": "azzb", "temperature": 0})
        assert status == 400 and "'z' (U+007A)" in body["error"]["message"] and body["error"]["param"] == "prompt"
        status, body = replacing.request("POST", "/v1/completions", {"prompt": "abc", "stop": ["a"]})
        assert status == 400 and body["error"]["param"] == "stop"
        status, body = replacing.request("GET", "/v1/models")
        assert status == 200 and body["data"][0]["arch"] == "encoder-decoder"
        # options left out: what `charlm sample` decodes with, the most likely target, whole
        whole = {"temperature": 0.0, "top_k": None, "top_p": 1.0, "max_tokens": None, "stop": []}
        assert body["data"][0]["sampling_defaults"] == whole
        left_out = client.completions.create(model="charlm", prompt=["abcd", "azzb"], n=2, seed=1)
        assert [c.text for c in left_out.choices] == [t for t in expected for _ in "ab"]
    finally:
        replacing.stop()


def test_charlm_serve_of_an_encoder_decoder_says_length_for_a_full_context_and_checks_what_a_decoder_checks(
    unknown_run, refusing
):
    # a replacement the model holds only as padding, start or end: one line at start-up, not a 400 for every client
    flags = ["--port", "0", "--unknown", "replace", "--replace-with", "\x02"]
    reserved = run_cli("serve", unknown_run, *flags, process=True, timeout=60)  # a server that starts serves for ever
    assert_one_line_error(reserved, 2, "--replace-with U+0002 is one of the model's padding, start and end symbols")
    model = charlm.load(unknown_run)
    room = model.config.model.block_size - 1  # the start symbol takes a position: a target this long never ended
    # a nearly uniform draw, whose targets often fill the context before the end symbol comes; eight rows in one
    # request are one request in the server's queue of one (--max-queue 1, below --max-n)
    status, body = refusing.request("POST", "/v1/completions", {"prompt": "abcd", "temperature": 50, "seed": 3, "n": 8})
    assert status == 200, body
    texts = [c["text"] for c in body["choices"]]
    assert texts == [model.transduce("abcd", temperature=50.0, seed=3 + j) for j in range(8)]
    reasons = [c["finish_reason"] for c in body["choices"]]
    assert reasons == ["length" if len(t) == room else "stop" for t in texts]
    assert set(reasons) == {"length", "stop"}, texts
    status, body = refusing.request("POST", "/v1/completions", {"prompt": "abcd", "seed": 2**63 - 1, "n": 2})
    assert status == 400 and "seed + n - 1 must be at most 2**63 - 1" in body["error"]["message"], body
    assert body["error"]["param"] == "seed"
    status, body = refusing.request("POST", "/v1/completions", {"prompt": "abcd", "temperature": 1e39, "top_k": 1})
    assert status == 400 and "temperature must be at most 10000" in body["error"]["message"], body
    status, body = refusing.request("POST", "/v1/completions", {"prompt": "abcd", "echo": 0})
    assert status == 400 and "echo must be a JSON boolean" in body["error"]["message"], body


def test_a_dev_file_s_unseen_characters_are_read_as_the_unknown_symbol_when_the_model_learns_one(tmp_path):
    """A shared task's own dev file holds characters its training file lacks: with data.unknown_dropout the run
    trains on it unedited, says how many were read as the unknown symbol and keeps the count in summary.json; without
    it, the refusal names data.unknown_dropout as the way on."""
    r = random.Random(1)
    words = ["".join(r.choice("abcdefgh") for _ in range(r.randint(3, 6))) for _ in range(300)]
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    dev = tmp_path / "dev.tsv"
    dev.write_text("abc\tcba\n걷굵a\ta굵걷\nbad\tdab\nq\tx\n")  # 2 + 2 Hangul, then q and x: 6 in 2 lines
    config = ["--config", "tiny", *SHAPE]
    sets = {"data.val_path": dev, "train.eval_interval": 1}
    result = run_cli(*train_cli(train, tmp_path / "run", steps=2, config=config, sets=sets))
    assert_one_line_error(result, 2, "dev.tsv has characters the model has never seen", "data.unknown_dropout")
    sets["data.unknown_dropout"] = 0.05
    result = run_cli(*train_cli(train, tmp_path / "run", steps=2, config=config, sets=sets, json=True))
    assert result.returncode == 0, result.stderr
    said = f"{dev}: 6 characters the training file lacks, in 2 lines, read as the unknown symbol (data.unknown_dropout)"
    assert said in result.stderr and "2 of those lines' targets hold one" in result.stderr
    expected = {str(dev): {"chars": 6, "lines": 2, "target_lines": 2, "features": 0}}
    assert json.loads(result.stdout.splitlines()[-1])["unseen_chars"] == expected
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["unseen_chars"] == expected
