"""Fine-tuning with --init-from: a new run starting from another model's weights, on new text."""

from __future__ import annotations

import os

import pytest
import torch

import charlm
from charlm.errors import UsageError
from charlm.storage.checkpoint import load_checkpoint
from tests.conftest import SMALL, assert_one_line_error, run_cli, train_cli

TINY = {
    "model.n_layer": 1,
    "model.n_embd": 32,
    "model.block_size": 16,
    "train.eval_interval": 10,
    "train.eval_windows": 16,
}


@pytest.fixture(scope="module")
def halves(tmp_path_factory, corpus):
    """The excerpt's first half without any 'z' (but with every other character), and its second half."""
    folder = tmp_path_factory.mktemp("halves")
    text = corpus.read_text(encoding="utf-8")
    first, second = folder / "first.txt", folder / "second.txt"
    every_other_character = "".join(sorted(set(text) - {"z"}))
    first.write_text(text[: len(text) // 2].replace("z", "s") + every_other_character, encoding="utf-8")
    second.write_text(text[len(text) // 2 :], encoding="utf-8")
    return first, second


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, halves):
    run = tmp_path_factory.mktemp("source") / "run"
    charlm.train("tiny", overrides={**TINY, "train.max_steps": 30}, data=halves[0], out_dir=run, quiet=True)
    return run


def test_a_fine_tuned_run_starts_from_the_source_weights_with_a_fresh_optimizer(tmp_path, halves, source_run):
    second = tmp_path / "second.txt"
    second.write_text(halves[1].read_text(encoding="utf-8").replace("z", "s"), encoding="utf-8")
    source = load_checkpoint(source_run / "best.pt")
    before = charlm.load(source_run, "cpu").evaluate(second, split="val").loss
    summary = charlm.train(
        "tiny",
        overrides={**{k: v for k, v in TINY.items() if not k.startswith("model.")}, "train.max_steps": 20},
        data=second,
        out_dir=tmp_path / "tuned",
        quiet=True,
        init_from=source_run,
    )
    tuned = load_checkpoint(tmp_path / "tuned" / "last.pt")
    assert tuned.config.model == source.config.model  # the shape is the source's, whatever the config file says
    assert tuned.tokenizer.chars == source.tokenizer.chars and tuned.step == 20 and summary["steps"] == 20
    assert tuned.config.data.path == str(second)
    assert summary["full_val_loss"] < before  # it learned the new text


def test_the_model_starts_exactly_where_the_source_ended(tmp_path, halves, source_run):
    from charlm.training.finetune import init_model

    source = load_checkpoint(source_run / "best.pt")
    model = init_model(source, source.config, source.tokenizer.vocab_size, torch.device("cpu"))
    for name, weight in source.state["model"].items():
        assert torch.equal(model.state_dict()[name], weight), name


def test_characters_the_model_never_saw_are_refused_by_name_with_counts(tmp_path, halves, source_run):
    count = halves[1].read_text(encoding="utf-8").count("z")
    with pytest.raises(UsageError, match=rf"'z' \(U\+007A\) x {count}.*--extend-vocab"):
        charlm.train(
            "tiny",
            overrides={**TINY, "train.max_steps": 2},
            data=halves[1],
            out_dir=tmp_path / "r",
            quiet=True,
            init_from=source_run,
        )
    assert not (tmp_path / "r").exists()


def test_extend_vocab_adds_fresh_rows_and_keeps_the_old_ones(tmp_path, halves, source_run):
    source = load_checkpoint(source_run / "best.pt")
    charlm.train(
        "tiny",
        overrides={**TINY, "train.max_steps": 2, "train.lr": 1e-9, "train.embed_lr": 1e-9, "train.head_lr": 1e-9},
        data=halves[1],
        out_dir=tmp_path / "x",
        quiet=True,
        init_from=source_run,
        extend_vocab=True,
    )
    tuned = load_checkpoint(tmp_path / "x" / "last.pt")
    old = source.tokenizer.chars
    assert tuned.tokenizer.chars[: len(old)] == old and tuned.tokenizer.chars[len(old) :] == ["z"]
    old_emb = source.state["model"]["tok_emb.weight"]
    new_emb = tuned.state["model"]["tok_emb.weight"]
    assert new_emb.shape[0] == old_emb.shape[0] + 1
    assert torch.allclose(new_emb[: len(old)], old_emb, atol=1e-5)  # lr ~0: the known rows are the source's
    assert 0.005 < float(new_emb[-1].std()) < 0.05  # the new row is a fresh N(0, 0.02) one, not zeros or a copy


def test_init_from_on_the_command_line_and_its_mistakes(tmp_path, halves, source_run, corpus):
    second = tmp_path / "s.txt"
    second.write_text(halves[1].read_text(encoding="utf-8").replace("z", "s"), encoding="utf-8")
    ok = run_cli(*train_cli(second, tmp_path / "ok", steps=3, init_from=source_run))
    assert ok.returncode == 0, ok.stderr
    assert "starting from the weights of" in ok.stderr
    # the command line's model keys: dropout taken, the source's shape and tokenizer kept or refused, never dropped
    regularised = run_cli(*train_cli(second, tmp_path / "d", steps=2, init_from=source_run, sets=["model.dropout=0.2"]))
    assert regularised.returncode == 0, regularised.stderr
    assert "dropout: 0.2" in (tmp_path / "d" / "config.yaml").read_text()
    # the command line's model keys meet the source's model, not the default config's (whose 3 heads refuse 32 wide)
    same = ["model.n_embd=32", "model.n_layer=1"]
    kept = run_cli(*train_cli(second, tmp_path / "f", steps=2, config=[], init_from=source_run, sets=same))
    assert kept.returncode == 0, kept.stderr
    for sets, needle in ((["model.n_layer=4"], "model.n_layer=4 (it has 1)"), (["data.tokenizer=byte"], "'byte'")):
        refused = run_cli(*train_cli(second, tmp_path / "e", steps=2, init_from=source_run, sets=sets))
        assert_one_line_error(refused, 2, "--init-from keeps the shape and tokenizer", needle)
    assert not (tmp_path / "e").exists()
    assert_one_line_error(
        run_cli(*train_cli(halves[1], tmp_path / "a", init_from=source_run)),
        2,
        "'z'",
        "--extend-vocab",
    )
    assert_one_line_error(
        run_cli(*train_cli(out=tmp_path / "b", extend_vocab=True)), 2, "--extend-vocab", "--init-from"
    )
    assert_one_line_error(
        run_cli(*train_cli(out=source_run, config=SMALL, resume=True, init_from=source_run)),
        2,
        "--resume",
        "--init-from",
    )
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes((source_run / "best.pt").read_bytes()[:5000])
    assert_one_line_error(
        run_cli(*train_cli(corpus, tmp_path / "c", init_from=damaged)),
        2,
        "cannot load checkpoint",
        "damaged",
    )
    assert not (tmp_path / "c").exists()


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_init_from_a_pickle_that_would_run_code_is_refused(tmp_path, source_run, corpus):
    marker = tmp_path / "pwned"
    state = torch.load(source_run / "best.pt", weights_only=True)
    state["payload"] = RunsCode(marker)
    torch.save(state, tmp_path / "evil.pt")
    assert_one_line_error(
        run_cli(*train_cli(corpus, tmp_path / "r", init_from=tmp_path / "evil.pt")),
        2,
        "could run code",
    )
    assert not marker.exists() and not (tmp_path / "r").exists()
