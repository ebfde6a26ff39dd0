"""The encoder-only model (model.arch: encoder): masked-character training, `charlm fill`, its scores, full
attention, exact resume, DDP, export, and one-line errors for what it cannot do."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import (
    SMALL,
    assert_one_line_error,
    assert_resume_is_exact,
    callers_signal_handlers,
    handlers_are,
    run_cli,
    train_cli,
)

import charlm
from charlm.config.build import load_config
from charlm.data.corpus import IGNORE
from charlm.data.masking import hide
from charlm.errors import UsageError
from charlm.families.registry import model_info
from charlm.models.encoder import Encoder

ENCODER = [*SMALL, "--set", "model.arch=encoder", "--set", "train.batch_size=64"]


@pytest.fixture(scope="module")
def encoder_run(tmp_path_factory, corpus):
    run = tmp_path_factory.mktemp("encoder") / "run"
    # batches of 256: a run of 64 leaves the unigram plateau (a space everywhere, ~15% right) by step 400 on some seeds
    # only (8 seeds: accuracy 0.149-0.295, one at 0.149); of 256, on every one (0.316-0.391, loss 2.17-2.54)
    sets = ["train.batch_size=256"]
    run_cli(*train_cli(corpus, run, steps=400, quiet=True, config=ENCODER, sets=sets), check=True)
    return run


def test_training_restores_hidden_characters_better_than_chance(encoder_run):
    scored = json.loads(run_cli("eval", encoder_run, "--json", check=True).stdout)
    vocabulary = 61
    assert scored["chars"] > 100 and scored["split"] == "val"
    assert scored["loss"] < math.log(vocabulary) - 0.8  # well below guessing among the characters
    assert scored["accuracy"] > 0.2  # the most frequent character alone (a space) is ~15%
    again = json.loads(run_cli("eval", encoder_run, "--json", check=True).stdout)
    assert again == scored  # the same positions hidden every time


def test_fill_prints_the_text_and_each_blanks_candidates(encoder_run):
    shown = run_cli("fill", encoder_run, "--prompt", "ROM_O AND JUL_ET", check=True).stdout
    filled = json.loads(run_cli("fill", encoder_run, "--prompt", "ROM_O AND JUL_ET", "--json", check=True).stdout)
    text = filled["text"]
    assert len(text) == len("ROM_O AND JUL_ET") and text[:3] + text[4:13] + text[14:] == "ROMO AND JULET"
    assert shown.startswith(text + "\n") and "  position 3: " in shown and "  position 13: " in shown
    result = json.loads(run_cli("fill", encoder_run, "--prompt", "th# king", "--mask-char", "#", "--top", "3",
                                "--json", check=True).stdout)  # fmt: skip
    (blank,) = result["blanks"]
    probabilities = [p for _, p in blank["candidates"]]
    assert blank["position"] == 2 and len(probabilities) == 3
    assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1.0 + 1e-6
    assert result["text"] == "th" + blank["candidates"][0][0] + " king"


def test_attention_is_full_not_triangular(encoder_run):
    shown = json.loads(run_cli("attention", encoder_run, "--prompt", "ROMEO: ", "--json", check=True).stdout)
    weights = torch.tensor(shown["weights"])  # (L, nh, T, T)
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)
    assert (weights[..., 0, 1:] > 0).all()  # the first character attends to the ones after it


def test_what_an_encoder_cannot_do_is_one_line(encoder_run, tiny_checkpoint):
    assert_one_line_error(run_cli("sample", encoder_run, "--prompt", "ROMEO"), 2, "fill")
    assert_one_line_error(run_cli("fill", tiny_checkpoint), 2, "generate")
    assert_one_line_error(run_cli("fill", encoder_run, "--prompt", "no blanks"), 2, "no '_' to fill")
    assert_one_line_error(run_cli("fill", encoder_run, "--prompt", "_" * 17), 2, "context is 16", "at most 16")
    assert_one_line_error(run_cli("eval", encoder_run, "--stride", "2"), 2, "hidden characters")
    assert_one_line_error(run_cli("serve", encoder_run, "--port", "0"), 2, "fill")  # nothing to complete
    with pytest.raises(UsageError, match="fill"):
        charlm.load(encoder_run).generate("ROMEO")
    for top in (0, 51, 2.5, True):  # the Python API's candidates, as the CLI's --top
        with pytest.raises(UsageError, match="top .candidates per blank. must be a whole number from 1 to 50"):
            charlm.load(encoder_run).fill("ROM_O", top=top)


def test_hiding_follows_berts_proportions():
    x = torch.randint(3, 60, (400, 64))
    inputs, targets = hide(x, 60, torch.Generator().manual_seed(0))
    chosen = targets != IGNORE
    assert (chosen.sum(1) >= 1).all()  # every window has something to restore
    assert 0.13 < chosen.float().mean() < 0.17
    assert torch.equal(targets[chosen], x[chosen])
    masked = (inputs == 60) & chosen
    kept = (inputs == x) & chosen
    assert 0.77 < masked.sum() / chosen.sum() < 0.83
    assert 0.08 < kept.sum() / chosen.sum() < 0.13  # 10% kept, plus random draws that hit the same character
    assert torch.equal(inputs[~chosen], x[~chosen])


def test_resume_is_exact(tmp_path, corpus):
    sets = ["train.eval_interval=3", "model.dropout=0.2", "train.log_interval=1"]  # every step's loss compared
    common = train_cli(corpus, config=ENCODER, sets=sets)
    assert_resume_is_exact(common, tmp_path)


def test_an_export_fills_identically(encoder_run, tmp_path):
    pytest.importorskip("safetensors")
    run_cli("export", encoder_run, tmp_path / "export", check=True)
    assert "hidden characters restored" in (tmp_path / "export" / "README.md").read_text()
    original, exported = charlm.load(encoder_run), charlm.load(tmp_path / "export")
    assert exported.fill("ROM_O AND JUL_ET") == original.fill("ROM_O AND JUL_ET")


def test_hostile_checkpoints_are_refused(encoder_run, tmp_path):
    state = torch.load(encoder_run / "best.pt", weights_only=True)
    state["model"]["tok_emb.weight"][0, 0] = float("inf")
    torch.save(state, tmp_path / "inf.pt")
    assert_one_line_error(run_cli("fill", tmp_path / "inf.pt"), 2, "non-finite weights")
    state = torch.load(encoder_run / "best.pt", weights_only=True)
    state["config"]["model"]["arch"] = "decoder"
    torch.save(state, tmp_path / "mismatch.pt")
    assert_one_line_error(run_cli("eval", tmp_path / "mismatch.pt"), 2, "does not match its recorded model shape")


def test_training_from_python_leaves_the_signal_handlers_alone(tmp_path, corpus):
    with callers_signal_handlers() as mine:
        overrides = {"model.arch": "encoder", "model.block_size": 16, "model.n_embd": 32, "train.max_steps": 5}
        summary = charlm.train("tiny", overrides, data=corpus, out_dir=tmp_path / "run", quiet=True)
        assert summary["steps"] == 5
        assert handlers_are(mine)


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["model.tie_weights=false", "model.head_bias=true"],
        ["model.pos_encoding=learned", "model.norm_position=post"],
        ["model.token_shift=true"],
    ],
)
def test_info_counts_every_parameter(sets):
    config = load_config("tiny", ["model.arch=encoder", *sets]).model
    model = Encoder(config, 61)
    assert model_info(config, 61).total_params == sum(p.numel() for p in model.parameters())


def test_muon_takes_the_encoders_matrices(tmp_path, corpus):
    from charlm.training.optim import hidden_matrices

    model = Encoder(load_config("tiny", ["model.arch=encoder"]).model, 61)
    matrices = hidden_matrices(model)
    assert len(matrices) == 5 * model.config.n_layer  # per block: Q, K/V, W_O and the feed-forward's two
    muon = ["train.optimizer=muon"]
    result = run_cli(*train_cli(corpus, tmp_path / "run", steps=3, quiet=True, config=ENCODER, sets=muon))
    assert result.returncode == 0, result.stderr
