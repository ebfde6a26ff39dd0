"""Prepared corpora: flat token files built once, re-built when the source changes or the file is damaged, never
half-written; byte models; folders of files; the three splits."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import train_cli

from charlm.config.schema import DataConfig
from charlm.data.corpus import Corpus, split_sizes
from charlm.data.prepare import SEPARATOR, prepare, prepared_paths
from charlm.data.tokenizer import ByteTokenizer, CharTokenizer
from charlm.errors import UsageError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def text_file(tmp_path: Path, corpus: Path) -> Path:
    path = tmp_path / "shakespeare.txt"
    path.write_bytes(corpus.read_bytes())
    return path


def _files(path: Path, kind: str = "char") -> tuple[Path, Path]:
    return prepared_paths(path, kind)


def test_a_prepared_corpus_reads_back_as_the_text_and_is_reused(text_file):
    text = text_file.read_text(encoding="utf-8")
    first = prepare(text_file, "char")
    bin_path, json_path = _files(text_file)
    assert bin_path.is_file() and json_path.is_file()
    assert first.ids.dtype == torch.uint8 and len(first.ids) == len(text)
    assert first.tokenizer.decode(first.ids.tolist()) == text
    meta = json.loads(json_path.read_text())
    assert (
        meta["source"]["files"][0]["size"] == text_file.stat().st_size
        and len(meta["source"]["files"][0]["sha256"]) == 64
    )
    stamp = bin_path.stat().st_mtime_ns
    said: list[str] = []
    again = prepare(text_file, "char", said.append)
    assert bin_path.stat().st_mtime_ns == stamp and not said  # reused, not rebuilt
    assert torch.equal(again.ids, first.ids)


def test_corpus_splits_are_nanogpts_90_10_by_default_and_exact_sizes_win(text_file):
    n = len(text_file.read_text(encoding="utf-8"))
    c = Corpus.from_config(DataConfig(path=str(text_file)))
    assert len(c.train) == int(n * 0.9) and len(c.train) + len(c.val) == n and len(c.test) == 0
    c = Corpus.from_config(DataConfig(path=str(text_file), val_size=5000, test_size=7000))
    assert (len(c.train), len(c.val), len(c.test)) == (n - 12000, 5000, 7000)
    assert torch.equal(torch.cat([c.train, c.val, c.test]), c.whole)  # in file order, no overlap, nothing lost
    with pytest.raises(UsageError, match="leave none for training"):
        split_sizes(100, DataConfig(val_size=60, test_size=40), "x.txt")


def test_byte_tokenizer_accepts_any_file_and_its_ids_are_the_bytes(tmp_path):
    raw = bytes(range(256)) * 40 + "naïve café\n".encode("latin-1")
    path = tmp_path / "binary.dat"
    path.write_bytes(raw)
    with pytest.raises(UsageError, match=r"not UTF-8 text: byte 0x80 at byte offset 128 .*data.tokenizer=byte"):
        prepare(path, "char")
    prepared = prepare(path, "byte")
    assert isinstance(prepared.tokenizer, ByteTokenizer) and prepared.ids.tolist() == list(raw)
    assert not _files(path, "char")[0].exists()  # the refused preparation left nothing behind


def test_byte_decoding_shows_invalid_utf8_as_replacement_characters_and_counts_them():
    tok = ByteTokenizer()
    ids = list("é ok".encode()) + [0xFF, 0xC3]  # a stray byte, then half of a two-byte character
    assert tok.decode(ids) == "é ok\ufffd\ufffd" and tok.replaced(ids) == 2
    assert tok.replaced(list("a real \ufffd".encode())) == 0  # an encoded U+FFFD is text, not a replacement
    stream = tok.stream_decoder()
    pieces = [stream.feed(b) for b in "né".encode()]
    assert pieces == ["n", "", "é"] and stream.flush() == ""  # a split character appears once it is whole


def test_a_folder_is_its_files_in_name_order_joined_by_the_separator(tmp_path):
    folder = tmp_path / "books"
    (folder / "b").mkdir(parents=True)
    (folder / "b" / "two.txt").write_text("second\n")
    (folder / "a.txt").write_text("first\n")
    (folder / ".hidden.txt").write_text("never read\n")
    (folder / "empty.txt").write_text("")
    prepared = prepare(folder, "char")
    assert prepared.tokenizer.decode(prepared.ids.tolist()) == "first\n" + SEPARATOR + "second\n"
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(UsageError, match=r"data folder .*books holds logo\.png, which is not UTF-8 text"):
        prepare(folder, "char")
    assert len(prepare(folder, "byte").ids) > len(prepared.ids)  # bytes take every file
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(UsageError, match="holds no non-empty files"):
        prepare(empty, "char")


def test_a_source_edited_after_preparation_is_prepared_again(text_file):
    prepare(text_file, "char")
    original = text_file.read_bytes()
    edited = original.replace(b"Citizen", b"CITIZEN", 1)
    assert len(edited) == len(original)
    text_file.write_bytes(edited)
    stat = text_file.stat()
    os.utime(text_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))  # an edit: same size, new mtime
    said: list[str] = []
    again = prepare(text_file, "char", said.append)
    assert "CITIZEN" in again.tokenizer.decode(again.ids[:200].tolist())
    assert said == [f"preparing {text_file} again: the source changed since it was prepared"]


def test_a_touched_source_with_the_same_bytes_is_not_prepared_again(text_file):
    prepare(text_file, "char")
    bin_path, json_path = _files(text_file)
    stamp = bin_path.stat().st_mtime_ns
    stat = text_file.stat()
    os.utime(text_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    prepare(text_file, "char")
    assert bin_path.stat().st_mtime_ns == stamp  # same SHA-256: only the description is refreshed
    assert json.loads(json_path.read_text())["source"]["files"][0]["mtime_ns"] == text_file.stat().st_mtime_ns


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage-json", "missing-bin"])
def test_a_damaged_prepared_file_is_rebuilt_never_trusted(text_file, damage):
    good = prepare(text_file, "char").ids.clone()
    bin_path, json_path = _files(text_file)
    if damage == "truncate":
        bin_path.write_bytes(bin_path.read_bytes()[:1000])
    elif damage == "flip":
        raw = bytearray(bin_path.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        bin_path.write_bytes(bytes(raw))
    elif damage == "garbage-json":
        json_path.write_text("{not json")
    else:
        bin_path.unlink()
    again = prepare(text_file, "char")
    assert torch.equal(again.ids, good)


@pytest.mark.process
def test_two_processes_preparing_the_same_corpus_at_once_both_get_it_whole(tmp_path, corpus):
    big = tmp_path / "big.txt"
    big.write_bytes(corpus.read_bytes() * 20)  # 2.4 MB: long enough for the two to overlap
    code = (
        "import sys; from charlm.data.prepare import prepare; p = prepare(sys.argv[1], 'char'); "
        "print(len(p.ids), int(p.ids.long().sum()))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(big)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert outputs[0][0] == outputs[1][0]
    prepared = prepare(big, "char")
    assert f"{len(prepared.ids)} {int(prepared.ids.long().sum())}" == outputs[0][0].strip()
    assert not list(tmp_path.glob(".*.tmp"))


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))


@pytest.mark.process
def test_a_full_disk_while_preparing_leaves_nothing_half_written(tmp_path, corpus):
    """The process is the subject (its file-size limit stands in for a full disk), so it runs as a subprocess."""
    data = tmp_path / "t.txt"
    data.write_bytes(corpus.read_bytes())  # 120 KB of ids: more than the 50 KB the process may write
    result = subprocess.run(
        [sys.executable, "-m", "charlm", *train_cli(data, tmp_path / "run", steps=2, config="tiny")],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_file_size,
        # Not measured by coverage (CI measures subprocesses): its data file could not be written under the limit.
        env={k: v for k, v in {**os.environ, "PYTHONPATH": str(REPO)}.items() if k != "COVERAGE_PROCESS_CONFIG"},
        stdin=subprocess.DEVNULL,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "cannot prepare" in lines[0] and "nothing half-written is kept" in lines[0]
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))  # the lock file is empty
    assert left == ["t.txt"]  # no token file, no description, no temp file
    assert len(prepare(data, "char").ids) == len(corpus.read_text(encoding="utf-8"))  # and next time it works


def test_a_model_vocabulary_reads_a_corpus_prepared_with_fewer_characters(text_file):
    own = prepare(text_file, "char").tokenizer
    wider = CharTokenizer(["\u00e9"] + own.chars)  # one more character, shifting every id by one
    c = Corpus.from_config(DataConfig(path=str(text_file)), wider)
    assert wider.decode(c.train[:60].tolist()) == text_file.read_text(encoding="utf-8")[:60]
    narrower = CharTokenizer([ch for ch in own.chars if ch != "z"])
    with pytest.raises(UsageError, match=r"1 character\(s\) not in the model's vocabulary: 'z' \(U\+007A\) x \d+"):
        Corpus.from_config(DataConfig(path=str(text_file)), narrower)
    skipped = Corpus.from_config(DataConfig(path=str(text_file)), narrower, unknown="skip")
    assert len(skipped.whole) == len(c.whole) - text_file.read_text(encoding="utf-8").count("z")
