"""The character tokenizer: sorted ids, round trips through text and JSON, and the policies for unknown characters."""

import pytest

from charlm.data.tokenizer import CharTokenizer
from charlm.errors import UsageError


def test_ids_follow_sorted_characters():
    tok = CharTokenizer.from_text("hello world")
    assert tok.chars == sorted(set("hello world"))
    assert tok.encode("de") == [tok.chars.index("d"), tok.chars.index("e")]


def test_encode_decode_round_trip():
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text


def test_json_round_trip_keeps_ids():
    tok = CharTokenizer.from_text("ñandú & 🐍\n")
    again = CharTokenizer.from_json(tok.to_json())
    assert again.chars == tok.chars
    assert again.encode("ñ🐍") == tok.encode("ñ🐍")


def test_unknown_characters_are_an_error_by_default_listing_code_points_and_positions():
    tok = CharTokenizer.from_text("abc ")
    with pytest.raises(UsageError) as info:
        tok.encode("a\u00e9b\u00e9z")
    message = str(info.value)
    assert "U+00E9" in message and "position 1" in message
    assert "'z' (U+007A) at position 4" in message
    assert "--unknown" in message


def test_unknown_skip_drops_them():
    tok = CharTokenizer.from_text("abc")
    assert tok.decode(tok.encode("axbyc", unknown="skip")) == "abc"


def test_unknown_replace_uses_the_chosen_character():
    tok = CharTokenizer.from_text("abc ")
    assert tok.decode(tok.encode("axb", unknown="replace", replacement="c")) == "acb"
    assert tok.decode(tok.encode("axb", unknown="replace")) == "a b"  # space by default


def test_replacement_must_be_in_the_vocabulary():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(UsageError, match="not in the vocabulary"):
        tok.encode("axb", unknown="replace", replacement="q")


def test_malformed_vocabulary_json_is_refused():
    with pytest.raises(UsageError):
        CharTokenizer.from_json('{"letters": "abc"}')
