"""`charlm download cmudict`: an excerpt of the real dictionary, served from a loopback server, verified and
converted to word<TAB>phonemes pairs (every pronunciation on a line, comments stripped, stress digits stripped or
kept)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from conftest import REPO, assert_one_line_error, run_cli

from charlm.data.download import CORPORA

# Real lines of cmudict.dict (tests/data/README.md): 1,521 lines, 1,379 words, 142 alternates, 22 comments.
EXCERPT = REPO / "tests" / "data" / "cmudict-excerpt.dict"
EXCERPT_SHA256 = "422aeda54f3737aa521b5949c3d41e02cc298ce086f70bef9b843c8f9159eb6f"
# What the conversion makes of it, checked once by an independent awk one-liner (tests/data/README.md).
EXCERPT_TSV_SHA256 = "17cbcbce89d545acba156e15eca89c41f8c71b2683f6df6ebe3c0aaddc1010af"
PINNED = "81917843c7f44ce2b094ac63873c2c7a4cf802040792c455ba3ca406891c3d22"


@pytest.fixture
def excerpt() -> bytes:
    body = EXCERPT.read_bytes()
    assert hashlib.sha256(body).hexdigest() == EXCERPT_SHA256, f"{EXCERPT} was modified"
    return body


def _pairs(path: Path) -> list[list[str]]:
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines.pop() == "", "the file ends with a newline"
    return [line.split("\t") for line in lines]


def test_cmudict_is_pinned_to_the_canonical_file():
    corpus = CORPORA["cmudict"]
    assert corpus.url == "https://raw.githubusercontent.com/cmusphinx/cmudict/master/cmudict.dict"
    assert corpus.sha256 == PINNED and corpus.dest == Path("data/cmudict.tsv")
    assert corpus.url_env == "CHARLM_CMUDICT_URL"
    assert (REPO / "tests" / "data" / "cmudict-LICENSE").read_text().startswith("Copyright (C) 1993-2015 Carnegie")


def test_the_excerpt_downloads_and_becomes_one_pair_per_pronunciation(tmp_path, mirror, excerpt):
    server = mirror(excerpt)
    dest = tmp_path / "cmudict.tsv"
    got = run_cli("download", "cmudict", "--url", server.url("good"), "--sha256", EXCERPT_SHA256, "--dest", dest)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "cmudict.dict").read_bytes() == excerpt  # the verified source is kept beside the pairs
    assert f"{dest}: 1,379 words, 1,518 pronunciations, one per line" in got.stderr
    assert "22 comments stripped, stress digits stripped, 3 alternates then the same written once" in got.stderr
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == EXCERPT_TSV_SHA256
    pairs = _pairs(dest)
    assert len(pairs) == 1518 and len({word for word, _ in pairs}) == 1379
    assert len({tuple(pair) for pair in pairs}) == 1518  # no line twice
    assert all(len(pair) == 2 and pair[0] and pair[1] for pair in pairs)  # exactly one TAB, both sides non-empty
    assert pairs[:3] == [["'bout", "B AW T"], ["'cause", "K AH Z"], ["'course", "K AO R S"]]  # AW1 -> AW
    expected = {
        "a": ["AH", "EY"],  # a(2) EY1 kept, on a line of its own after the first
        "aalborg": ["AO L B AO R G", "AA L B AO R G"],  # "# place, danish" stripped
        "dail": ["D EY L", "D OY L"],  # dail(2) D OY1 L # org, irish: an alternate with a comment
        "d'artagnan": ["D AH R T AE NG Y AH N"],
    }
    assert {word: [p for w, p in pairs if w == word] for word in expected} == expected
    text = dest.read_text(encoding="utf-8")
    assert "#" not in text and "(" not in text and "  " not in text and " \n" not in text
    assert all(word == word.lower() for word, _ in pairs)  # the file's lowercase spelling, unchanged
    assert all(re.fullmatch(r"[A-Z]+( [A-Z]+)*", phonemes) for _, phonemes in pairs)  # no stress digits
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_cmudict_stress_keeps_the_digits(tmp_path, mirror, excerpt):
    server = mirror(excerpt)
    dest = tmp_path / "stress.tsv"
    got = run_cli("download", "cmudict-stress", "--url", server.url("good"), "--sha256", EXCERPT_SHA256, "--dest", dest)
    assert got.returncode == 0, got.stderr
    assert "stress digits kept" in got.stderr
    pairs = _pairs(dest)
    assert len(pairs) == 1521 and pairs[:2] == [["'bout", "B AW1 T"], ["'cause", "K AH0 Z"]]
    assert all(re.fullmatch(r"[A-Z]+[012]?( [A-Z]+[012]?)*", phonemes) for _, phonemes in pairs)


def test_a_second_run_keeps_the_verified_file_and_fetches_nothing(tmp_path, mirror, excerpt):
    server = mirror(excerpt)
    args = ("download", "cmudict", "--sha256", EXCERPT_SHA256, "--dest", tmp_path / "cmudict.tsv")
    run_cli(*args, env={"CHARLM_CMUDICT_URL": server.url("good")}, check=True)  # the mirror variable
    before = (tmp_path / "cmudict.tsv").read_bytes()
    again = run_cli(*args, "--url", server.url("good"), check=True)
    assert "already there, verified" in again.stderr and "words written" not in again.stderr
    assert server.requests == {"/good": 1} and (tmp_path / "cmudict.tsv").read_bytes() == before


def test_the_default_destination_and_a_file_url(tmp_path, excerpt):
    got = run_cli("download", "cmudict", "--url", EXCERPT.as_uri(), "--sha256", EXCERPT_SHA256, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert len(_pairs(tmp_path / "data" / "cmudict.tsv")) == 1518
    assert (tmp_path / "data" / "cmudict.dict").read_bytes() == excerpt


def test_a_file_that_is_not_the_pinned_one_is_refused_and_nothing_is_written(tmp_path, mirror, excerpt):
    server = mirror(excerpt)
    result = run_cli("download", "cmudict", "--url", server.url("good"), "--dest", tmp_path / "cmudict.tsv")
    assert_one_line_error(result, 1, f"expected {PINNED}", "CHARLM_CMUDICT_URL", "cmudict.dict")
    assert list(tmp_path.iterdir()) == []
    wrong = "0" * 64
    result = run_cli(
        "download", "cmudict", "--url", server.url("good"), "--sha256", wrong, "--dest", tmp_path / "c.tsv"
    )
    assert_one_line_error(result, 1, f"expected {wrong}", "nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_a_tsv_without_its_verified_dictionary_beside_it_is_not_trusted(tmp_path, mirror, excerpt):
    dest = tmp_path / "cmudict.tsv"
    dest.write_text("hand\tHH AE1 N D\n")
    server = mirror(excerpt)
    result = run_cli("download", "cmudict", "--url", server.url("good"), "--sha256", EXCERPT_SHA256, "--dest", dest)
    assert_one_line_error(result, 2, "no verified cmudict.dict is beside it", "--force")
    assert server.requests == {} and dest.read_text() == "hand\tHH AE1 N D\n"
    forced = run_cli(*result.args[1:], "--force", check=True)
    assert "1,379 words, 1,518 pronunciations" in forced.stderr and len(_pairs(dest)) == 1518


def test_a_destination_that_would_be_the_dictionary_itself_is_refused(tmp_path):
    result = run_cli("download", "cmudict", "--dest", tmp_path / "cmudict.dict")
    assert_one_line_error(result, 2, "would be the downloaded .dict file itself", "cmudict.tsv")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"hello HH AH0 L OW1\ngoodbye\n", "line 2 is not `word PHONEME ...` (it reads 'goodbye')"),
        (b"caf\xe9 K AE0 F EY1\n", "is not UTF-8 text"),
        (b"\n# only a comment\n", "holds no `word PHONEME ...` line"),
    ],
)
def test_a_file_that_is_not_a_pronouncing_dictionary_is_refused(tmp_path, mirror, body, needle):
    server = mirror(body)
    dest = tmp_path / "cmudict.tsv"
    result = run_cli("download", "cmudict", "--url", server.url("good"), "--no-verify", "--dest", dest)
    assert_one_line_error(result, 1, needle, "check the mirror")
    assert not dest.exists() and [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_blank_lines_whole_line_comments_and_extra_spaces_are_skipped(tmp_path, mirror):
    body = b";;; an old-style header\n\nread  R IY1 D\nread(2) R EH1 D # past\n# a note\nWORD W ER1 D\n"
    server = mirror(body)
    dest = tmp_path / "cmudict.tsv"
    got = run_cli("download", "cmudict", "--url", server.url("good"), "--no-verify", "--dest", dest, check=True)
    assert dest.read_text(encoding="utf-8") == "read\tR IY D\nread\tR EH D\nWORD\tW ER D\n"  # case kept, no stress
    assert "2 words, 3 pronunciations, one per line (3 comments stripped" in got.stderr
