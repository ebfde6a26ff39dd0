"""Encoder-decoder ensembles (`--ensemble`): decoding and scoring on the members' mean log-probabilities, a model
with itself the same as alone, and one-line refusals of models that cannot join."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, run_cli, train_cli
from test_encdec import SHAPE, reversal_file

import charlm
from charlm.config.build import load_config
from charlm.data.tokenizer import BOS, PAD
from charlm.decoding.steps import ModuleTargetSteps
from charlm.evaluation.transduction import ensemble_total, pairs_total
from charlm.models.encoder_decoder import EncoderDecoder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Reversal pairs, and two models trained on them from different seeds (not fully trained: they disagree)."""
    tmp = tmp_path_factory.mktemp("ensemble")
    data = reversal_file(tmp / "reverse.tsv", lines=1000)
    adamw = ["train.optimizer=adamw", "train.lr=3e-3"]  # Muon's orthogonalisations would be most of the time here
    for seed in (1, 2):
        run_cli(
            *train_cli(data, tmp / f"run{seed}", steps=60, quiet=True, config=SHAPE, sets=adamw, seed=seed),
            check=True,
        )
    return data, tmp / "run1", tmp / "run2"


def eval_json(run: Path, *args: object) -> dict:
    return json.loads(run_cli("eval", run, "--json", *args, check=True).stdout)


def test_steps_take_the_mean_log_probability_and_the_loss_is_never_above_the_members_mean():
    torch.manual_seed(0)
    config = load_config("tiny", ["model.arch=encoder-decoder", "data.format=pairs", "model.block_size=16"]).model
    a, b = EncoderDecoder(config, 12).eval(), EncoderDecoder(config, 12).eval()
    sources = [[3, 4, 5], [6, 7]]
    token = torch.full((2, 1), BOS)
    together = ModuleTargetSteps([a, b], sources).logits(token)
    alone = [ModuleTargetSteps(m, sources).logits(token).log_softmax(-1) for m in (a, b)]
    torch.testing.assert_close(together, (alone[0] + alone[1]) / 2)
    assert together[:, [PAD, BOS]].isinf().all()
    pairs = [([3, 4, 5], [6, 7, 8]), ([6, 7], [9]), ([10, 11, 3, 4], [5, 6])]
    cpu = torch.device("cpu")
    (ta, count), (tb, _) = (pairs_total(m, pairs, cpu) for m in (a, b))
    assert ensemble_total([a, a], pairs, cpu, 2) == pytest.approx((ta, count), rel=1e-6)  # a model with itself
    total, _ = ensemble_total([a, b], pairs, cpu, 2)
    assert total < (ta + tb) / 2  # the renormalised geometric mean: below the members' mean loss unless they agree


def test_a_model_with_itself_decodes_and_scores_as_it_does_alone(runs):
    _, run1, _ = runs
    for beam in ("1", "3"):
        alone, doubled = eval_json(run1, "--beam", beam), eval_json(run1, "--beam", beam, "--ensemble", run1)
        assert doubled.pop("ensemble") == [str(run1 / "best.pt")] * 2
        assert doubled.pop("loss") == pytest.approx(alone.pop("loss"), abs=1e-5)
        doubled.pop("bpc"), alone.pop("bpc")
        assert doubled == alone


def test_eval_and_sample_decode_with_every_member(runs, tmp_path):
    _, run1, run2 = runs
    one, two = charlm.load(run1), charlm.load(run2)
    scored = eval_json(run1, "--ensemble", run2, "--beam", "3")
    api = one.evaluate_pairs(beam=3, ensemble=[two]).to_dict()
    assert scored["exact_match"] == api["exact_match"] and scored["loss"] == pytest.approx(api["loss"], abs=1e-6)
    assert scored["loss"] < (eval_json(run1)["loss"] + eval_json(run2)["loss"]) / 2
    words = tmp_path / "words.txt"
    words.write_text("abcdef\nhgfe\njjab\n", encoding="utf-8")
    out = run_cli("sample", run1, "--prompt-file", words, "--ensemble", run2, check=True)
    targets = one.transduce(["abcdef", "hgfe", "jjab"], ensemble=[two])
    assert out.stdout == "".join(f"{s}\t{t}\n" for s, t in zip(["abcdef", "hgfe", "jjab"], targets, strict=True))
    assert "an ensemble of 2 models" in out.stderr
    listed = json.loads(run_cli("sample", run1, "--prompt", "abcdef", "--ensemble", run2, "--json", check=True).stdout)
    assert listed["targets"][0]["target"] == targets[0] and len(listed["ensemble"]) == 2


def test_models_that_cannot_join_are_refused_in_one_line(runs, tmp_path, tiny_checkpoint):
    data, run1, _ = runs
    assert_one_line_error(run_cli("eval", run1, "--ensemble", tiny_checkpoint), 2, "decoder", "encoder-decoder")
    assert_one_line_error(run_cli("eval", tiny_checkpoint, "--ensemble", run1), 2, "--ensemble")
    assert_one_line_error(run_cli("sample", run1, "--prompt", "abc", "--ensemble", tmp_path / "nope"), 2, "nope")
    other = tmp_path / "other.tsv"
    other.write_text("".join(f"{w}\t{w.upper()}\n" for w in ("xyz", "zyx", "yx") * 50), encoding="utf-8")
    run_cli(*train_cli(other, tmp_path / "letters", steps=2, quiet=True, config=SHAPE), check=True)
    refused = run_cli("eval", run1, "--ensemble", tmp_path / "letters")
    assert_one_line_error(refused, 2, "vocabulary differs")
    sets = ["model.block_size=20"]
    run_cli(*train_cli(data, tmp_path / "longer", steps=2, quiet=True, config=SHAPE, sets=sets), check=True)
    assert_one_line_error(run_cli("eval", run1, "--ensemble", tmp_path / "longer"), 2, "model.block_size")
