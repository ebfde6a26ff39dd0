"""The character corpus: its train/val split, seeded batches that resume where they stopped, full passes that score
every character once, and one-line refusals of files that cannot be a corpus."""

import pytest
import torch

from charlm.data.corpus import Corpus, RandomWindows, full_pass_windows, read_text, split_text
from charlm.errors import UsageError


def test_split_is_first_90_percent_train_last_10_val(corpus):
    c = Corpus.from_file(corpus, 0.1)
    text = corpus.read_text(encoding="utf-8")
    assert len(c.train) == int(len(text) * 0.9) and len(c.train) + len(c.val) == len(text)
    assert c.tokenizer.decode(c.val[:50].tolist()) == text[int(len(text) * 0.9) :][:50]
    assert c.train.dtype == torch.uint8 and c.tokenizer.vocab_size == len(set(text)) == 61


def test_same_seed_gives_the_same_batches(corpus):
    c = Corpus.from_file(corpus, 0.1)
    a = RandomWindows(c.train, 32, 8, torch.device("cpu"), seed=3)
    b = RandomWindows(c.train, 32, 8, torch.device("cpu"), seed=3)
    other = RandomWindows(c.train, 32, 8, torch.device("cpu"), seed=4)
    for _ in range(3):
        (xa, ya), (xb, yb), (xo, _) = a.next_batch(), b.next_batch(), other.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert not torch.equal(xa, xo)


def test_sampler_state_round_trip_continues_the_stream(corpus):
    c = Corpus.from_file(corpus, 0.1)
    a = RandomWindows(c.train, 16, 4, torch.device("cpu"), seed=1)
    a.next_batch()
    state = a.state_dict()
    expected = a.next_batch()[0]
    b = RandomWindows(c.train, 16, 4, torch.device("cpu"), seed=99)
    b.load_state_dict(state)
    assert torch.equal(b.next_batch()[0], expected)


def test_y_is_x_shifted_by_one(corpus):
    c = Corpus.from_file(corpus, 0.1)
    x, y = RandomWindows(c.train, 64, 16, torch.device("cpu"), seed=0).next_batch()
    assert x.shape == y.shape == (16, 64) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    text = c.tokenizer.decode(x[0].tolist()) + c.tokenizer.decode(y[0, -1:].tolist())
    assert text in corpus.read_text(encoding="utf-8")


def test_full_pass_scores_every_character_after_the_first_exactly_once():
    ids = torch.arange(103) % 7
    batches = list(full_pass_windows(ids, block_size=10, batch_size=4))
    ys = torch.cat([y.reshape(-1) for _, y in batches])
    assert len(ys) == 102
    assert torch.equal(ys, ids[1:])
    assert batches[-1][0].shape == (1, 2)  # the short tail window


def test_invalid_utf8_is_refused_with_the_byte_offset(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"caf" + b"\xe9 au lait")
    with pytest.raises(UsageError, match="byte offset 3"):
        read_text(f)


def test_empty_file_is_refused(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_bytes(b"")
    with pytest.raises(UsageError, match="empty"):
        read_text(f)


def test_missing_file_and_directory_are_refused(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        read_text(tmp_path / "nope.txt")
    with pytest.raises(UsageError, match="directory"):
        read_text(tmp_path)


def test_too_short_for_a_window_is_refused(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("to be or not to be " * 3)
    c = Corpus.from_file(f, 0.1)
    with pytest.raises(UsageError, match="too short"):
        c.check_windows(64, str(f))


def test_any_utf8_text_works(tmp_path):
    f = tmp_path / "poem.txt"
    f.write_text("Ελληνικά και 日本語 🙂\n" * 50, encoding="utf-8")
    c = Corpus.from_file(f, 0.2)
    c.check_windows(16, str(f))
    assert split_text("abcdefghij", 0.2) == ("abcdefgh", "ij")
