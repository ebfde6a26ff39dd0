"""Splits given as their own files (data.val_path, data.test_path), as shared tasks hand them out: validation reads
the given file, training never reads the test file, and every mistake with them is refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import assert_one_line_error, assert_resume_is_exact, run_cli, train_cli
from test_encdec import SHAPE

from charlm.config.build import load_config
from charlm.data.corpus import Corpus
from charlm.data.lines import LineCorpus
from charlm.data.pairs import PairCorpus
from charlm.errors import UsageError


def reversals(path: Path, count: int, seed: int) -> Path:
    r = random.Random(seed)
    words = ["".join(r.choice("abcdefgh") for _ in range(r.randint(3, 7))) for _ in range(count)]
    path.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words), encoding="utf-8")
    return path


@pytest.fixture
def text_splits(tmp_path: Path, corpus: Path) -> tuple[Path, Path, Path]:
    """The excerpt cut into a training file, a validation file and a test file (no character only in the last two)."""
    text = corpus.read_text(encoding="utf-8")
    n = len(text)
    train, val, test = tmp_path / "train.txt", tmp_path / "val.txt", tmp_path / "test.txt"
    train.write_text(text[: int(n * 0.8)], encoding="utf-8")
    known = set(text[: int(n * 0.8)])
    val.write_text("".join(c for c in text[int(n * 0.8) : int(n * 0.9)] if c in known), encoding="utf-8")
    test.write_text("".join(c for c in text[int(n * 0.9) :] if c in known), encoding="utf-8")
    return train, val, test


def test_text_validates_on_the_given_file_and_never_reads_the_test_file(tmp_path, text_splits):
    train, val, test = text_splits
    good_test = test.read_bytes()
    test.write_bytes(b"\xff\xfe not text at all \xff")  # reading it as text would stop the run
    run = tmp_path / "run"
    sets = {"data.val_path": val, "data.test_path": test, "train.eval_windows": 16}
    result = run_cli(*train_cli(train, run, steps=30, sets=sets, json=True, quiet=True))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    # best.pt was chosen on the given file: the run's full validation pass is the given file scored whole.
    of_val = json.loads(run_cli("eval", run, "--data", val, "--split", "all", "--json", check=True).stdout)
    assert of_val["loss"] == pytest.approx(summary["full_val_loss"], abs=1e-4)
    assert of_val["chars"] == len(val.read_text(encoding="utf-8")) - 1
    default = json.loads(run_cli("eval", run, "--json", check=True).stdout)  # the run's own validation split
    assert default["loss"] == pytest.approx(of_val["loss"], abs=1e-6)
    test.write_bytes(good_test)
    scored = json.loads(run_cli("eval", run, "--split", "test", "--json", check=True).stdout)
    assert scored["chars"] == len(good_test.decode()) - 1 and scored["file"] == str(test)
    assert scored["loss"] != pytest.approx(default["loss"], abs=1e-6)
    whole = json.loads(run_cli("eval", run, "--split", "train", "--json", check=True).stdout)
    assert whole["chars"] == len(train.read_text(encoding="utf-8")) - 1  # all of data.path is trained on


def test_pairs_given_splits_resume_exactly_and_score_the_test_file(tmp_path):
    train, val = reversals(tmp_path / "train.tsv", 400, 0), reversals(tmp_path / "val.tsv", 50, 1)
    test = reversals(tmp_path / "test.tsv", 60, 2)
    common = ["train", "--config", "tiny", *SHAPE, "--data", train, "--set", f"data.val_path={val}"]
    common += ["--set", f"data.test_path={test}", "--set", "train.eval_interval=3"]  # 3 divides 6: one log either way
    assert_resume_is_exact(common, tmp_path, steps=12)
    run = tmp_path / "straight"
    scored = json.loads(run_cli("eval", run, "--split", "test", "--json", check=True).stdout)
    assert scored["lines"] == 60
    assert json.loads(run_cli("eval", run, "--json", check=True).stdout)["lines"] == 50
    config = load_config("tiny", [*SHAPE[1::2], f"data.path={train}", f"data.val_path={val}"])
    corpus = PairCorpus.from_config(config.data, config.model.block_size)
    assert len(corpus.train) == 400 and len(corpus.val) == 50  # the whole training file is trained on


def test_lines_given_splits(tmp_path):
    names = ["anna", "bob", "carla", "dora", "emil", "fred", "greta", "hugo", "ida", "jan"] * 30
    train, val, test = tmp_path / "train.txt", tmp_path / "val.txt", tmp_path / "test.txt"
    train.write_text("\n".join(names) + "\n")
    val.write_text("anna\nbob\n\nemil\n")
    test.write_text("carla\ndora\nhugo\n")
    config = load_config(None, [f"data.path={train}", f"data.val_path={val}", f"data.test_path={test}"])
    corpus = LineCorpus.from_config(config.data, config.model.block_size)
    assert (len(corpus.train), len(corpus.val)) == (300, 3)
    assert [corpus.tokenizer.decode(i) for i in corpus.split("test")] == ["carla", "dora", "hugo"]


def test_fractions_beside_a_given_file_are_refused(tmp_path, text_splits):
    train, val, test = text_splits
    for sets, named in (
        ([f"data.val_path={val}", "data.val_fraction=0.2"], "data.val_fraction"),
        ([f"data.test_path={test}", "data.test_size=100"], "data.test_size"),
    ):
        result = run_cli(*train_cli(train, tmp_path / "run", steps=2, sets=sets))
        assert_one_line_error(result, 2, named, "both choose the", "remove")
        assert not (tmp_path / "run").exists()


def test_a_config_files_fraction_yields_to_a_file_given_on_the_command_line(tmp_path):
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("data:\n  val_fraction: 0.2\n  val_path: dev.txt\n")
    config = load_config("g2p", ["data.val_path=dev.tsv", "data.test_path=test.tsv"])  # g2p.yaml sets sizes
    assert (config.data.val_path, config.data.test_path) == ("dev.tsv", "test.tsv")
    with pytest.raises(UsageError, match=r"data.val_fraction \(.*mine.yaml\) and data.val_path=dev.txt both choose"):
        load_config(config_file)
    with pytest.raises(UsageError, match=r"data.test_fraction \(--set data.test_fraction=0.1\) and data.test_path="):
        load_config("g2p", ["data.test_path=test.tsv", "data.test_fraction=0.1"])
    saved = tmp_path / "config.yaml"  # what a run folder keeps: every key, the yielded sizes back at their defaults
    saved.write_text(config.to_yaml())
    assert load_config(saved).data.val_path == "dev.tsv"
    saved.write_text(load_config("g2p-small").to_yaml())
    assert load_config(saved, ["data.val_fraction=0.1"]).data.test_path  # a default value is never asked about


def test_hostile_given_files(tmp_path, text_splits):
    train, _, _ = text_splits
    pairs = reversals(tmp_path / "train.tsv", 200, 0)
    three_columns = tmp_path / "bad.tsv"
    three_columns.write_text("abc\tcba\nabd\tdba\textra\n")
    shape = [*SHAPE[1::2], f"data.path={pairs}"]
    config = load_config("tiny", [*shape, f"data.val_path={three_columns}"])
    with pytest.raises(UsageError, match=r"bad.tsv: 1 without exactly one tab \(line 2\)"):
        PairCorpus.from_config(config.data, config.model.block_size)

    unseen = tmp_path / "unseen.tsv"
    unseen.write_text("abz\tzba\n")
    config = load_config("tiny", [*shape, f"data.val_path={unseen}"])
    with pytest.raises(UsageError, match=r"unseen.tsv has characters the model has never seen: 'z' \(U\+007A\)"):
        PairCorpus.from_config(config.data, config.model.block_size)

    strange = tmp_path / "strange.txt"
    strange.write_text("Zebra ~ quartz\n")
    result = run_cli(*train_cli(train, tmp_path / "run", steps=2, sets={"data.val_path": strange}))
    assert_one_line_error(result, 2, "strange.txt holds characters the training file", "'~'")

    missing = run_cli(*train_cli(train, tmp_path / "run", steps=2, sets={"data.test_path": tmp_path / "nope.txt"}))
    assert_one_line_error(missing, 2, "data.test_path not found", "nope.txt")


def test_a_test_file_equal_to_the_training_file_is_warned(tmp_path, text_splits):
    train, val, _ = text_splits
    copy = tmp_path / "copy.txt"
    copy.write_bytes(train.read_bytes())
    sets = {"data.val_path": val, "data.test_path": copy}
    result = run_cli(*train_cli(train, tmp_path / "run", steps=2, sets=sets))
    assert result.returncode == 0, result.stderr
    assert "the test file" in result.stderr and "is the training file itself" in result.stderr
    text = Corpus.from_config(load_config(None, [f"data.path={train}", f"data.test_path={copy}"]).data)
    assert len(text.split("test")) == len(text.split("all"))  # the whole training file, read again
