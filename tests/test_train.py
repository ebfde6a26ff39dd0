"""Training, checkpoints and eval through the real CLI (subprocesses) and the real modules."""

import json
import math
import shutil

import pytest
import torch
from conftest import FULL_CORPUS_BYTES, assert_one_line_error, run_cli, train_cli

from charlm.config.schema import Config, ModelConfig
from charlm.data.tokenizer import CharTokenizer
from charlm.models.decoder import Decoder
from charlm.storage.checkpoint import load_checkpoint, save_checkpoint


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(run_dir, corpus, steps=30, **options):
    """A SMALL run with its JSON summary; options as train_cli's (sets=[...], seed=7)."""
    return run_cli(*train_cli(corpus, run_dir, steps=steps, json=True, **options), check=True)


def test_tiny_config_leaves_a_complete_run_folder(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "tiny", config="tiny", json=True), check=True)
    for name in ("best.pt", "last.pt", "config.yaml", "metrics.jsonl"):
        assert (tmp_path / "tiny" / name).is_file(), name
    summary = json.loads(result.stdout)
    assert summary["steps"] == 200 and summary["tokens"] == 200 * 16 * 32
    assert summary["full_val_loss"] < 2.7 and summary["tokens_per_s"] > 0
    assert set(summary) >= {"best_val_loss", "steps", "tokens", "wall_s", "tokens_per_s", "compile_s"}
    assert len(_metrics(tmp_path / "tiny")) == 4  # every 50 steps


def test_eval_json_reports_loss_bpc_perplexity_chars(tmp_path, corpus):
    _train(tmp_path / "r", corpus)
    result = run_cli("eval", tmp_path / "r" / "best.pt", "--data", corpus, "--json", check=True)
    figures = json.loads(result.stdout)
    assert set(figures) == {"loss", "bpc", "perplexity", "chars", "split", "file", "stride", "unit", "runtime"}
    assert figures["runtime"] == "torch"
    assert figures["split"] == "val" and figures["file"] == str(corpus)
    assert math.isclose(figures["bpc"], figures["loss"] / math.log(2))
    assert math.isclose(figures["perplexity"], math.exp(figures["loss"]))
    n = len(corpus.read_text(encoding="utf-8"))
    assert figures["chars"] == n - int(n * 0.9) - 1


def test_eval_needs_only_the_checkpoint_and_the_text(tmp_path, corpus):
    _train(tmp_path / "r", corpus)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(tmp_path / "r" / "best.pt", elsewhere / "model.pt")
    shutil.copy(corpus, elsewhere / "text.txt")
    shutil.rmtree(tmp_path / "r")
    result = run_cli("eval", "model.pt", "--data", "text.txt", "--split", "all", "--json", cwd=elsewhere, check=True)
    assert json.loads(result.stdout)["chars"] == len(corpus.read_text(encoding="utf-8")) - 1


def test_eval_refuses_unknown_characters_unless_asked(tmp_path, corpus):
    _train(tmp_path / "r", corpus)
    odd = tmp_path / "odd.txt"
    odd.write_text("ROMEO:\nWhat light through yonder window breaks? \u00bfQu\u00e9?\n" * 20)
    refused = run_cli("eval", tmp_path / "r" / "best.pt", "--data", odd)
    assert_one_line_error(refused, 2, "U+00BF", "--unknown")
    skipped = run_cli("eval", tmp_path / "r" / "best.pt", "--data", odd, "--unknown", "skip", "--json", check=True)
    assert json.loads(skipped.stdout)["chars"] > 0


def test_same_seed_gives_the_same_losses_and_weights(tmp_path, corpus):
    _train(tmp_path / "a", corpus)
    _train(tmp_path / "b", corpus)
    _train(tmp_path / "c", corpus, seed=7)
    losses = [[(m["train_loss"], m["val_loss"]) for m in _metrics(tmp_path / d)] for d in "abc"]
    assert losses[0] == losses[1] and losses[0] != losses[2]
    a, b = (load_checkpoint(tmp_path / d / "last.pt").state["model"] for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_continues_the_step_count(tmp_path, corpus):
    _train(tmp_path / "r", corpus, steps=20)
    sets = ["sample.temperature=0.5"]  # no part of training: a resume may change it
    result = run_cli(*train_cli(out=tmp_path / "r", resume=True, steps=40, json=True, sets=sets), check=True)
    assert json.loads(result.stdout)["steps"] == 40
    assert load_checkpoint(tmp_path / "r" / "last.pt").config.sample.temperature == 0.5
    assert [m["step"] for m in _metrics(tmp_path / "r")] == [10, 20, 30, 40]
    assert load_checkpoint(tmp_path / "r" / "last.pt").step == 40
    for steps in (40, 30):  # at or past its limit: refused, no record added
        done = run_cli(*train_cli(out=tmp_path / "r", resume=True, steps=steps))
        assert_one_line_error(done, 2, "is at step 40, already its limit of", "larger --max-steps")
    assert [m["step"] for m in _metrics(tmp_path / "r")] == [10, 20, 30, 40]


def test_resume_refuses_to_change_the_model_shape(tmp_path, corpus):
    _train(tmp_path / "r", corpus, steps=10)
    result = run_cli(*train_cli(out=tmp_path / "r", resume=True, sets=["model.n_layer=3"]))
    assert_one_line_error(result, 2, "model.n_layer", "resum")


def test_an_existing_run_is_not_overwritten_by_accident(tmp_path, corpus):
    _train(tmp_path / "r", corpus, steps=10)
    before = (tmp_path / "r" / "best.pt").read_bytes()
    result = run_cli(*train_cli(corpus, tmp_path / "r", steps=10))
    assert_one_line_error(result, 2, "--resume", "--overwrite")
    assert (tmp_path / "r" / "best.pt").read_bytes() == before
    # --overwrite with what cannot run (a model, a batch too big for any memory): one line, and the old run whole,
    # since its files go only once the new run has trained a step
    files = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}
    too_big = (["model.n_embd=1000000", "model.n_head=1"], "model.n_embd"), (["train.batch_size=100000000000"], "batch")
    for sets, named in too_big:
        result = run_cli(*train_cli(corpus, tmp_path / "r", steps=10, overwrite=True, quiet=True, sets=sets))
        assert_one_line_error(result, 2, "not enough memory", named)
        assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == files
    run_cli(*train_cli(corpus, tmp_path / "r", steps=10, overwrite=True), check=True)
    assert (tmp_path / "r" / "best.pt").read_bytes() != before
    assert [m["step"] for m in _metrics(tmp_path / "r")] == [10]  # the old run's records went with it


def test_checkpoint_round_trip_reproduces_logits_exactly(tmp_path):
    torch.manual_seed(0)
    config = Config(model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.1))
    tokenizer = CharTokenizer.from_text("abcdefgh \n")
    model = Decoder(config.model, tokenizer.vocab_size).eval()
    save_checkpoint(
        tmp_path / "m.pt",
        {"config": config.to_dict(), "vocab": tokenizer.chars, "model": model.state_dict(), "step": 3},
    )
    loaded = load_checkpoint(tmp_path / "m.pt")
    again = loaded.build_model().eval()
    x = torch.randint(tokenizer.vocab_size, (2, 16))
    assert torch.equal(model(x)[0], again(x)[0])
    assert loaded.tokenizer.chars == tokenizer.chars and loaded.step == 3
    assert not any(k.startswith("_orig_mod.") for k in loaded.state["model"])


def test_missing_data_file_is_a_clear_error(tmp_path):
    result = run_cli(*train_cli(tmp_path / "nope.txt", tmp_path / "r", config="tiny"))
    assert_one_line_error(result, 2, "data path not found", "nope.txt", "--data PATH")
    assert "charlm download" not in result.stderr  # no built-in corpus lives there


def test_train_fetches_the_default_corpus_when_missing(tmp_path, full_corpus):
    result = run_cli(*train_cli(steps=10, json=True), cwd=tmp_path, env={"CHARLM_DATA_URL": full_corpus.as_uri()})
    assert result.returncode == 0, result.stderr
    assert "downloading tiny-shakespeare" in result.stderr
    assert (tmp_path / "data" / "tinyshakespeare.txt").stat().st_size == FULL_CORPUS_BYTES
    assert (tmp_path / "runs" / "tiny" / "best.pt").is_file()  # default out-dir: runs/<config name>


def test_cosine_schedule_decays_to_min_lr_over_max_steps(tmp_path, corpus):
    _train(
        tmp_path / "r", corpus, steps=40, sets=["train.lr_schedule=cosine", "train.warmup_steps=5", "train.min_lr=1e-4"]
    )
    lrs = [m["lr"] for m in _metrics(tmp_path / "r")]
    assert lrs == sorted(lrs, reverse=True) and len(set(lrs)) == 4
    assert abs(lrs[-1] - 1e-4) < 5e-5  # the lr of the last step, near the floor


def test_linear_schedule_follows_a_straight_line(tmp_path, corpus):
    _train(
        tmp_path / "r", corpus, steps=40, sets=["train.lr_schedule=linear", "train.min_lr=0", "train.warmup_steps=0"]
    )
    lrs = [m["lr"] for m in _metrics(tmp_path / "r")]
    peak = 3e-3  # configs/tiny.yaml
    assert [round(lr / peak, 3) for lr in lrs] == [round(1 - s / 40, 3) for s in (9, 19, 29, 39)]


def test_label_smoothing_is_what_training_minimises_and_evaluation_leaves_out():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8), 10)
    x, y = torch.randint(10, (2, 8)), torch.randint(10, (2, 8))
    model.label_smoothing = 0.2
    logits, smoothed = model(x, y)
    flat = (logits.view(-1, 10), y.view(-1))
    torch.testing.assert_close(smoothed, torch.nn.functional.cross_entropy(*flat, label_smoothing=0.2))
    model.eval()
    torch.testing.assert_close(model(x, y)[1], torch.nn.functional.cross_entropy(*flat))


def test_a_smoothed_run_reports_plain_cross_entropy(tmp_path, corpus):
    summary = json.loads(_train(tmp_path / "r", corpus, sets=["train.label_smoothing=0.1"]).stdout)
    scored = json.loads(run_cli("eval", tmp_path / "r" / "best.pt", "--json", check=True).stdout)
    assert summary["full_val_loss"] == pytest.approx(scored["loss"], abs=1e-6)  # no smoothing in either
    _train(tmp_path / "plain", corpus)  # the same seed and batches: only the training loss differs
    smoothed, plain = (load_checkpoint(tmp_path / name / "best.pt") for name in ("r", "plain"))
    assert smoothed.config.train.label_smoothing == 0.1 and plain.config.train.label_smoothing == 0.0
    assert not torch.equal(smoothed.state["model"]["head.weight"], plain.state["model"]["head.weight"])
    refused = run_cli(*train_cli(corpus, tmp_path / "s", steps=5, sets=["train.label_smoothing=1"]))
    assert_one_line_error(refused, 2, "train.label_smoothing")


def test_bf16_autocast_path_trains_on_cpu(tmp_path, corpus):
    """The mixed-precision path that CUDA takes by default, exercised here on the CPU."""
    result = _train(tmp_path / "r", corpus, steps=20, sets=["train.dtype=bfloat16"])
    assert json.loads(result.stdout)["full_val_loss"] < 4.0


def test_float16_on_cpu_is_refused_with_a_hint(tmp_path, corpus):
    result = run_cli(*train_cli(corpus, tmp_path / "r", sets=["train.dtype=float16"]))
    assert_one_line_error(result, 2, "float16", "bfloat16")


@pytest.mark.slow
def test_compile_true_trains_and_reports_compile_time(tmp_path, corpus):
    summary = json.loads(_train(tmp_path / "r", corpus, steps=20, sets=["train.compile=true"]).stdout)
    assert summary["steps"] == 20 and summary["compile_s"] > 0
    state = load_checkpoint(tmp_path / "r" / "last.pt").state["model"]
    assert not any(k.startswith("_orig_mod.") for k in state)  # the unwrapped model is saved


def test_cuda_device_without_a_gpu_is_a_clear_error(tmp_path, corpus):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_cli(*train_cli(corpus, tmp_path / "r", device="cuda"))
    assert_one_line_error(result, 2, "cuda", "--device cpu")
