"""enwik8 and text8: downloaded (from small stand-ins on a loopback server), verified, extracted, split the papers'
way and evaluated in bits per byte or per character."""

from __future__ import annotations

import hashlib
import io
import json
import random
import zipfile
from pathlib import Path

from charlm.data.download import CORPORA
from tests.conftest import assert_one_line_error, run_cli, train_cli

SMALL_MODEL = [  # --set values
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=16",
    "train.max_steps=6",
    "train.max_seconds=0",
    "train.eval_interval=3",
    "train.eval_windows=8",
    "train.warmup_steps=2",
]


def _zip(member: str, body: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, body)
    return out.getvalue()


def _enwik8_like(n: int) -> bytes:
    """Wikipedia-like XML with some bytes that are not UTF-8, as enwik8 has (it is modelled as bytes)."""
    rng = random.Random(8)
    words = ["<page>", "<title>", "Anarchism", "</title>", "[[", "]]", "the", "of", "&amp;", "{{cite}}", "\n"]
    body = b" ".join(rng.choice(words).encode() for _ in range(n // 5))
    return body[: n - 4] + b"\xff\xfe\xc3\x28"


def test_the_download_command_offers_exactly_the_builtin_corpora():
    from charlm.cli.support import BuiltinCorpus

    assert [c.value for c in BuiltinCorpus] == list(CORPORA)


def test_the_real_corpora_are_pinned():
    assert CORPORA["enwik8"].url == "http://mattmahoney.net/dc/enwik8.zip"
    assert CORPORA["enwik8"].sha256 == "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
    assert CORPORA["text8"].url == "http://mattmahoney.net/dc/text8.zip"
    assert CORPORA["text8"].sha256 == "a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232"
    assert (CORPORA["enwik8"].member, CORPORA["text8"].member) == ("enwik8", "text8")


def test_enwik8_downloads_extracts_trains_on_bytes_and_reports_bits_per_byte(tmp_path, mirror):
    body = _enwik8_like(60_000)
    archive = _zip("enwik8", body)
    server = mirror(archive)
    dest = tmp_path / "enwik8"
    digest = hashlib.sha256(archive).hexdigest()
    got = run_cli("download", "enwik8", "--url", server.url("good"), "--sha256", digest, "--dest", dest)
    assert got.returncode == 0, got.stderr
    assert dest.read_bytes() == body and (tmp_path / "enwik8.zip").read_bytes() == archive
    again = run_cli("download", "enwik8", "--url", server.url("good"), "--sha256", digest, "--dest", dest, check=True)
    assert "already there, verified" in again.stderr and server.requests["/good"] == 1

    run = tmp_path / "run"
    sets = ["data.val_size=5000", "data.test_size=5000", *SMALL_MODEL]
    trained = run_cli(*train_cli(dest, run, config="enwik8", sets=sets, json=True))
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["unit"] == "byte"
    figures = json.loads(run_cli("eval", run, "--split", "test", "--json", check=True).stdout)
    assert figures["unit"] == "byte" and figures["split"] == "test" and figures["chars"] == 5000 - 1
    assert "bits/byte" in run_cli("eval", run, "--split", "test", check=True).stdout
    sampled = json.loads(
        run_cli(
            "sample", run, "--prompt", "<page>", "--max-new-tokens", "200", "--seed", "1", "--json", check=True
        ).stdout
    )
    assert sampled["samples"][0].startswith("<page>") and isinstance(sampled["replaced"], int)


def test_text8_splits_90_5_5_the_papers_way_and_scores_the_test_split(tmp_path, mirror):
    rng = random.Random(27)
    body = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     ") for _ in range(40_000)).encode()
    archive = _zip("text8", body)
    server = mirror(archive)
    dest = tmp_path / "text8"
    run_cli(
        "download",
        "text8",
        "--url",
        server.url("good"),
        "--sha256",
        hashlib.sha256(archive).hexdigest(),
        "--dest",
        dest,
        check=True,
    )
    run = tmp_path / "run"
    sets = ["data.val_size=2000", "data.test_size=2000", *SMALL_MODEL]
    run_cli(*train_cli(dest, run, config="text8", sets=sets), check=True)
    figures = json.loads(run_cli("eval", run, "--split", "test", "--stride", "4", "--json", check=True).stdout)
    assert figures["chars"] == 1999 and figures["unit"] == "char" and figures["stride"] == 4
    val = json.loads(run_cli("eval", run, "--json", check=True).stdout)
    assert val["split"] == "val" and val["chars"] == 1999


def test_a_mirror_with_other_bytes_is_refused_and_nothing_is_written(tmp_path, mirror):
    server = mirror(_zip("enwik8", b"not the real enwik8"))
    result = run_cli("download", "enwik8", "--url", server.url("good"), "--dest", tmp_path / "enwik8")
    assert_one_line_error(result, 1, "expected 547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc")
    assert list(tmp_path.iterdir()) == []


def test_an_archive_without_the_corpus_inside_is_refused(tmp_path, mirror):
    archive = _zip("something-else", b"hello")
    server = mirror(archive)
    result = run_cli(
        "download",
        "text8",
        "--url",
        server.url("good"),
        "--sha256",
        hashlib.sha256(archive).hexdigest(),
        "--dest",
        tmp_path / "text8",
    )
    assert_one_line_error(result, 1, "has no 'text8' inside")
    assert not (tmp_path / "text8").exists()
    not_zip = mirror(b"plain text, not a zip")
    result = run_cli(
        "download",
        "text8",
        "--url",
        not_zip.url("good"),
        "--sha256",
        hashlib.sha256(b"plain text, not a zip").hexdigest(),
        "--dest",
        tmp_path / "t8",
        "--force",
    )
    assert_one_line_error(result, 1, "is not a zip archive")
    assert not (tmp_path / "t8").exists()


def test_an_unknown_corpus_name_lists_the_choices():
    result = run_cli("download", "enwik9")
    assert result.returncode == 2 and "tinyshakespeare" in result.stderr and "Traceback" not in result.stderr


def test_training_on_a_missing_builtin_corpus_downloads_it_from_its_mirror(tmp_path, mirror):
    body = _enwik8_like(40_000)
    archive = _zip("enwik8", body)
    server = mirror(archive)
    (tmp_path / "data").mkdir()
    # the pinned hash cannot match a stand-in, so a user's mirror must hold the real archive: this one does not
    result = run_cli(
        *train_cli(out=tmp_path / "run", config="enwik8", sets=SMALL_MODEL),
        cwd=tmp_path,
        env={"CHARLM_ENWIK8_URL": server.url("good")},
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("data/enwik8 is missing: downloading enwik8 from http://127.0.0.1")
    assert lines[1].startswith("error: ") and "expected 547994d9980ebed1288380d652999f38a14fe291a6247c" in lines[1]
    assert "CHARLM_ENWIK8_URL" in lines[1] and len(lines) == 2
    assert server.requests["/good"] == 1 and not (tmp_path / "data" / "enwik8").exists()
    assert not (tmp_path / "run").exists()


def test_the_shipped_recipes_hold_the_papers_splits():
    from charlm.config.build import load_config

    for name, tokenizer in (("enwik8", "byte"), ("text8", "char"), ("enwik8-gpu", "byte"), ("text8-gpu", "char")):
        data = load_config(name).data
        assert (data.tokenizer, data.val_size, data.test_size) == (tokenizer, 5_000_000, 5_000_000), name
        assert Path(data.path) == CORPORA[name.split("-")[0]].dest
