"""Strided evaluation: every character after the first scored exactly once, each with the promised context."""

from __future__ import annotations

import json

import pytest
import torch

import charlm
from charlm.data.corpus import IGNORE, strided_windows
from charlm.errors import UsageError
from charlm.evaluation.loss import full_pass
from tests.conftest import assert_one_line_error, run_cli


@pytest.mark.parametrize(
    "n,T,S", [(1000, 32, 1), (1000, 32, 7), (1001, 32, 32), (257, 64, 16), (40, 64, 8), (65, 64, 3), (500, 16, 15)]
)
def test_every_character_is_scored_once_with_at_least_block_size_minus_stride_context(n, T, S):
    ids = torch.arange(n, dtype=torch.int16)  # each id is its own position
    scored = torch.zeros(n, dtype=torch.int64)
    windows = 0
    for x, y in strided_windows(ids, T, S, batch_size=5):
        for row_x, row_y in zip(x, y, strict=True):
            for j in torch.nonzero(row_y != IGNORE).flatten().tolist():
                target = int(row_y[j])
                assert target == int(row_x[j]) + 1 and int(row_x[0]) == target - j - 1  # y is x shifted by one
                scored[target] += 1
                assert windows == 0 or j + 1 >= T - S, (target, j + 1)  # j + 1 characters of context
            windows += 1
    assert scored[0] == 0 and bool((scored[1:] == 1).all()), scored


def test_stride_equal_to_the_context_is_the_plain_full_pass(tiny_checkpoint):
    model = charlm.load(tiny_checkpoint, "cpu")
    ids = torch.randint(model.tokenizer.vocab_size, (3000,), generator=torch.Generator().manual_seed(0))
    T = model.config.model.block_size
    plain = full_pass(model.module, ids, T, model.device)
    same = full_pass(model.module, ids, T, model.device, stride=T)
    overlapping = full_pass(model.module, ids, T, model.device, stride=4)
    assert plain.loss == same.loss and plain.chars == same.chars == overlapping.chars == 2999
    assert overlapping.stride == 4 and plain.stride == T


def test_more_context_scores_real_text_better(tiny_checkpoint, corpus):
    model = charlm.load(tiny_checkpoint, "cpu")
    wide = model.evaluate(corpus, split="val")
    narrow = model.evaluate(corpus, split="val", stride=2)
    assert narrow.chars == wide.chars and narrow.stride == 2
    assert narrow.loss < wide.loss  # every character sees at least block_size - 2 before it


def test_eval_stride_on_the_command_line(tiny_checkpoint, corpus):
    result = run_cli("eval", tiny_checkpoint, "--data", corpus, "--split", "val", "--stride", "8", "--json", check=True)
    figures = json.loads(result.stdout)
    assert figures["stride"] == 8 and figures["unit"] == "char" and figures["split"] == "val"
    text = run_cli("eval", tiny_checkpoint, "--data", corpus, "--stride", "8", check=True).stdout
    assert "stride 8" in text and "nats/char" in text
    assert_one_line_error(
        run_cli("eval", tiny_checkpoint, "--data", corpus, "--stride", "999"),
        2,
        "--stride",
        "between 1 and the model's context",
    )
    assert_one_line_error(run_cli("eval", tiny_checkpoint, "--stride", "0"), 2, "--stride")


def test_a_run_without_a_test_split_says_so(tiny_checkpoint):
    model = charlm.load(tiny_checkpoint, "cpu")
    with pytest.raises(UsageError, match="has no test split: set data.test_path, data.test_size or data.test_fraction"):
        model.evaluate(split="test")
