"""ONNX exports (`charlm export --format onnx`) of the three families, run by the real onnxruntime: logits within
1e-4 of the torch model's, greedy text identical to `charlm sample --temperature 0`, `charlm sample`/`eval` on the
folder, and one-line refusals of what cannot be exported."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from conftest import SMALL, assert_one_line_error, run_cli, skip_without, train_cli

import charlm
from charlm.storage.checkpoint import load_checkpoint, save_checkpoint
from charlm.storage.web_export import CDN

pytestmark = [
    skip_without("onnxruntime", reason="ONNX exports need the onnx extra: pip install -e '.[test]'"),
    skip_without("onnxscript", reason="torch.onnx's exporter needs onnxscript: pip install -e '.[test]'"),
]

TOLERANCE = 1e-4
# The default recipe's options (configs/cpu.yaml: RoPE, SwiGLU, token shift) at the width of the 6 x 384 model
# (6 heads of 64) whose export scripts/bench_onnx.py times: the width sets how much float error sums up inside each
# matrix product, the tolerance's test; one layer, as the exporter's time grows with their number. Then learned
# positions and GELU (windows that jump); then ALiBi with the other switches thrown, in two layers (each layer's
# cache in and out of the stepped graph).
RECIPE = ["--config", "cpu", "--set", "train.max_seconds=0", "--set", "model.n_layer=1", "--set", "model.n_embd=384"]
RECIPE += ["--set", "model.n_head=6", "--set", "model.block_size=24"]
RECIPE += ["--set", "train.eval_windows=8", "--set", "train.eval_interval=10"]
# AdamW: Muon's orthogonalisation at this width, on batches this small, would be most of the training time, and the
# optimizer leaves nothing in an export.
RECIPE += ["--set", "train.optimizer=adamw"]
LEARNED = [*SMALL, "--set", "model.pos_encoding=learned", "--set", "model.activation=gelu"]
ALIBI = [*SMALL, "--set", "model.pos_encoding=alibi", "--set", "model.norm=rmsnorm", "--set", "model.qk_norm=true"]
ALIBI += ["--set", "model.norm_position=post", "--set", "model.logit_softcap=15", "--set", "model.tie_weights=false"]
ALIBI += ["--set", "model.token_shift=true", "--set", "model.n_head=4", "--set", "model.n_layer=2"]


def shifted_checkpoint(run: Path) -> Path:
    """best.pt with random token-shift weights (training leaves them near their zero start, where the shift does
    nothing, and an export that mishandled its state would still pass)."""
    ckpt = load_checkpoint(run / "best.pt")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in ckpt.state["model"].items():
        if "token_shift" in name:
            tensor.copy_(torch.randn(tensor.shape, generator=generator))
    save_checkpoint(run / "shifted.pt", {k: v for k, v in ckpt.state.items() if k != "format_version"})
    return run / "shifted.pt"


def train(tmp: Path, config: list[str], data: Path, steps: int = 30, shift: bool = False) -> Path:
    """A model trained through the CLI: its best.pt, or with `shift` a copy with random token-shift weights."""
    run_cli(*train_cli(data, tmp / "run", steps=steps, quiet=True, config=config), check=True)
    return shifted_checkpoint(tmp / "run") if shift else tmp / "run" / "best.pt"


# One export per kind for the worker: this module's tests share one, and so does tests/test_export_folders.py
# (SAME_WORKER in tests/conftest.py), which damages copies of the "learned" one.
_decoders: dict[str, tuple[Path, Path]] = {}


def exported_decoder(kind: str, tmp_path_factory, corpus: Path) -> tuple[Path, Path]:
    """A trained decoder's checkpoint and its ONNX export, made once per kind (callers only read them)."""
    if kind not in _decoders:
        tmp = tmp_path_factory.mktemp(f"onnx-{kind}")
        config = {"recipe": RECIPE, "learned": LEARNED, "alibi": ALIBI}[kind]
        ckpt = train(tmp, config, corpus, steps=10 if kind == "recipe" else 30, shift=kind != "learned")
        result = run_cli("export", ckpt, tmp / "onnx", "--format", "onnx", check=True)
        assert "200 greedy characters identical" in result.stderr
        _decoders[kind] = ckpt, tmp / "onnx"
    return _decoders[kind]


@pytest.fixture(scope="module", params=["recipe", "learned", "alibi"])
def decoder(request, tmp_path_factory, corpus) -> tuple[Path, Path]:
    return exported_decoder(request.param, tmp_path_factory, corpus)


@pytest.fixture(scope="module")
def recipe_decoder(tmp_path_factory, corpus) -> tuple[Path, Path]:
    return exported_decoder("recipe", tmp_path_factory, corpus)


def sample_json(model: Path, *args: object) -> dict:
    return json.loads(run_cli("sample", model, "--json", *args, check=True).stdout)


def test_the_decoder_export_gives_torchs_logits_and_greedy_text(decoder):
    ckpt, folder = decoder
    check = json.loads((folder / "config.json").read_text())["onnx"]["check"]
    assert check["max_abs_diff"] <= TOLERANCE and check["differs"] == ""
    exported, original = charlm.load(folder), charlm.load(ckpt, "cpu")
    assert exported.runtime == "onnxruntime" and original.runtime == "torch"
    block = original.config.model.block_size
    ids = torch.tensor([random.Random(1).choices(range(original.tokenizer.vocab_size), k=block) for _ in range(3)])
    with torch.no_grad():
        ours = original.module(ids)[0]
    assert (exported.module(ids)[0] - ours).abs().max() <= TOLERANCE  # a batch of whole windows, from a fresh state
    long_prompt = "JULIET:\n" + "O Romeo, Romeo! wherefore art thou Romeo? " * 3  # longer than the context
    for prompt in ("JULIET:", long_prompt):
        args = ("--prompt", prompt, "--temperature", "0", "--max-new-tokens", "200")
        through, reference = sample_json(folder, *args), sample_json(ckpt, *args)
        assert through["runtime"] == "onnxruntime" and reference["runtime"] == "torch"
        assert through["samples"] == reference["samples"]


def test_sampling_through_onnxruntime_draws_as_charlm_does(decoder):
    """The Python runtime uses charlm's own sampler and seeded torch.Generator: a seed gives charlm's text."""
    ckpt, folder = decoder
    args = ("--prompt", "ROMEO:", "--seed", "7", "--temperature", "0.9", "--top-k", "20", "--max-new-tokens", "120")
    through = sample_json(folder, *args, "--num-samples", "2", "--stop", "\n\n")
    assert through["samples"] == sample_json(ckpt, *args, "--num-samples", "2", "--stop", "\n\n")["samples"]


def test_eval_runs_the_export_through_onnxruntime(decoder, corpus, tmp_path):
    ckpt, folder = decoder
    text = tmp_path / "text.txt"  # the corpus's first 20,000 characters: a validation split of 2,000
    text.write_text(corpus.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    args = ("--data", text, "--split", "val", "--json")
    through = json.loads(run_cli("eval", folder, *args, check=True).stdout)
    reference = json.loads(run_cli("eval", ckpt, *args, check=True).stdout)
    assert through["runtime"] == "onnxruntime" and reference["runtime"] == "torch"
    assert through["chars"] == reference["chars"] and abs(through["loss"] - reference["loss"]) < 1e-5


@pytest.fixture(scope="module")
def encoder_decoder(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("onnx-encdec")
    r = random.Random(0)
    words = ["".join(r.choice("abcdefghij") for _ in range(r.randint(3, 8))) for _ in range(3000)]
    pairs = tmp / "reverse.tsv"
    pairs.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words), encoding="utf-8")
    config = [*SMALL, "--set", "model.arch=encoder-decoder", "--set", "data.format=pairs", "--set", "model.n_head=4"]
    config += ["--set", "model.pos_encoding=rope", "--set", "model.token_shift=true", "--set", "train.batch_size=32"]
    ckpt = train(tmp, config, pairs, steps=60, shift=True)
    result = run_cli("export", ckpt, tmp / "onnx", "--format", "onnx", check=True)
    assert "8 greedy targets identical" in result.stderr
    return ckpt, tmp / "onnx"


def test_the_encoder_decoder_export_rewrites_as_charlm_does(encoder_decoder, tmp_path):
    ckpt, folder = encoder_decoder
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "decoder.onnx", "encoder.onnx", "vocab.json"]  # fmt: skip  # noqa: E501
    check = json.loads((folder / "config.json").read_text())["onnx"]["check"]
    assert check["max_abs_diff"] <= TOLERANCE
    sources = tmp_path / "sources.txt"
    sources.write_text("abcde\njihgfedcba\nbad\n", encoding="utf-8")
    through = sample_json(folder, "--prompt-file", sources)
    assert through["runtime"] == "onnxruntime"
    assert through["targets"] == sample_json(ckpt, "--prompt-file", sources)["targets"]
    sampled = ("--prompt", "abcdef", "--temperature", "1", "--seed", "3")
    assert sample_json(folder, *sampled)["targets"] == sample_json(ckpt, *sampled)["targets"]
    beam = ("--prompt-file", sources, "--beam", "3")  # beam search steps the same loop through the graphs
    assert sample_json(folder, *beam)["targets"] == sample_json(ckpt, *beam)["targets"]
    for command in (("eval", folder, "--ensemble", ckpt), ("sample", ckpt, "--prompt", "abc", "--ensemble", folder)):
        assert_one_line_error(run_cli(*command), 2, "--ensemble", "ONNX export")


def test_the_encoder_decoder_export_is_scored_as_the_checkpoint_is(encoder_decoder, tmp_path):
    ckpt, folder = encoder_decoder
    pairs = tmp_path / "pairs.tsv"  # a word twice, with two targets: scored against both
    pairs.write_text("abcde\tedcba\nabcde\tabcde\njihgf\tfghij\nbad\tdab\nhij\tjih\n", encoding="utf-8")
    through, reference = (
        json.loads(run_cli("eval", m, "--data", pairs, "--json", check=True).stdout) for m in (folder, ckpt)
    )
    assert through["runtime"] == "onnxruntime" and reference["runtime"] == "torch"
    assert through["loss"] == pytest.approx(reference["loss"], abs=TOLERANCE)
    for key in ("word_error_rate", "char_error_rate", "lines", "sources", "single_reference"):
        assert through[key] == reference[key], key
    assert (through["lines"], through["sources"]) == (5, 4)


def test_the_encoder_export_fills_and_scores_as_charlm_does(tmp_path, corpus):
    ckpt = train(tmp_path, [*SMALL, "--set", "model.arch=encoder", "--set", "train.batch_size=32"], corpus, 40)
    run_cli("export", ckpt, tmp_path / "onnx", "--format", "onnx", check=True)
    folder = tmp_path / "onnx"
    assert json.loads((folder / "config.json").read_text())["onnx"]["check"]["max_abs_diff"] <= TOLERANCE
    fill = ("fill", "--prompt", "ROM_O AND JUL_ET", "--json")
    through, reference = (json.loads(run_cli(fill[0], m, *fill[1:], check=True).stdout) for m in (folder, ckpt))
    assert through["text"] == reference["text"]
    for a, b in zip(through["blanks"], reference["blanks"], strict=True):
        assert [c for c, _ in a["candidates"]] == [c for c, _ in b["candidates"]]
    args = ("--data", corpus, "--split", "val", "--json")  # an export records the file's name, not its path
    scored = [json.loads(run_cli("eval", m, *args, check=True).stdout) for m in (folder, ckpt)]
    assert scored[0]["runtime"] == "onnxruntime" and abs(scored[0]["loss"] - scored[1]["loss"]) < 1e-5
    assert scored[0]["accuracy"] == scored[1]["accuracy"]
    assert_one_line_error(run_cli("export", ckpt, tmp_path / "web", "--web"), 2, "encoder", "--web")


def test_what_cannot_be_exported_is_refused_in_one_line(tmp_path, corpus, tiny_checkpoint, recipe_decoder):
    ckpt, folder = tiny_checkpoint, recipe_decoder[1]
    moe = train(tmp_path / "moe", [*SMALL, "--set", "model.n_experts=2"], corpus, steps=3)
    assert_one_line_error(run_cli("export", moe, tmp_path / "a", "--format", "onnx"), 2, "n_experts=2", "mixture")
    assert not (tmp_path / "a").exists()
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(ckpt.read_bytes()[:5000])
    assert_one_line_error(run_cli("export", damaged, tmp_path / "b", "--format", "onnx"), 2, "cannot load checkpoint")
    pickled = tmp_path / "pickled.pt"
    torch.save({"config": {}, "payload": print}, pickled)  # a global: loading it would run code
    assert_one_line_error(run_cli("export", pickled, tmp_path / "c", "--format", "onnx"), 2, "could run code")
    assert_one_line_error(run_cli("export", folder, tmp_path / "d", "--format", "onnx"), 2, "is an ONNX export")
    for needs_torch in (("info",), ("attention", "--json"), ("serve", "--port", "0")):
        assert_one_line_error(run_cli(needs_torch[0], folder, *needs_torch[1:]), 2, "ONNX export")
    for flag in (("--compile",), ("--precision", "int8"), ("--no-cache",), ("--device", "cuda")):
        assert_one_line_error(run_cli("sample", folder, *flag), 2, flag[0])
    assert not any((tmp_path / name).exists() for name in "abcd")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left behind


def test_a_limit_far_beyond_the_text_costs_onnxruntime_only_what_is_decoded(tmp_path_factory, corpus):
    """The loop's buffer of ids grows through the graphs as through torch (past 4,096 places, windows jumping)."""
    ckpt, folder = exported_decoder("learned", tmp_path_factory, corpus)
    text = charlm.load(folder).generate("a", max_new_tokens=4200, temperature=0)
    assert len(text) == 4201 and text[:200] == charlm.load(ckpt).generate("a", max_new_tokens=199, temperature=0)
    stopped = charlm.load(folder).generate("a", max_new_tokens=10**12, stop=[" "], seed=1)
    assert stopped.startswith("a") and len(stopped) < 1000 and " " not in stopped


def test_overwrite_replaces_an_earlier_export_whole_and_nothing_else(tmp_path, tiny_checkpoint, monkeypatch):
    """A folder with anything in it needs --overwrite, which replaces only an earlier export (either format, none of
    its files left behind): never a folder of the user's files, a run folder, or the current folder."""
    run = tmp_path / "run"  # a run folder of this test's own: a wrong --overwrite must have nothing shared to delete
    shutil.copytree(tiny_checkpoint.parent, run)
    ckpt, target = run / "best.pt", tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    for args in (("--format", "onnx"), ("--web",), ()):
        assert_one_line_error(run_cli("export", ckpt, target, *args), 2, "not empty", "--overwrite")
        result = run_cli("export", ckpt, target, *args, "--overwrite")
        assert_one_line_error(result, 2, "not a charlm export", "another DIR")
    run_files = sorted(p.name for p in run.iterdir())
    for args in (("--format", "onnx"), ()):  # the checkpoint's own run folder
        assert_one_line_error(run_cli("export", ckpt, run, *args, "--overwrite"), 2, "not a charlm export")
    assert sorted(p.name for p in run.iterdir()) == run_files
    monkeypatch.chdir(target)
    for here in (".", "..", "../out/../out"):
        assert_one_line_error(run_cli("export", ckpt, here, "--overwrite"), 2, "current folder")
    monkeypatch.chdir(tmp_path)
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    exported = tmp_path / "exported"
    run_cli("export", ckpt, exported, check=True)
    run_cli("export", ckpt, exported, "--web", "--overwrite", check=True)  # the page, with the public runtime
    page = ["charlm-page.css", "charlm-page.js", "charlm-web.css", "charlm-web.js", "index.html"]
    files = sorted(["README.md", "config.json", "model.onnx", "vocab.json", *page])
    assert sorted(p.name for p in exported.iterdir()) == files  # no model.safetensors left beside the graphs
    assert f'src="{CDN}ort.wasm.min.js"' in (exported / "index.html").read_text()
    run_cli("export", ckpt, exported, "--overwrite", check=True)
    assert sorted(p.name for p in exported.iterdir()) == ["README.md", "config.json", "model.safetensors", "vocab.json"]
    (exported / ".git").mkdir()  # an export published from its folder: the user's files beside it stop --overwrite
    assert_one_line_error(run_cli("export", ckpt, exported, "--overwrite"), 2, "not a charlm export's (.git)")
    assert (exported / ".git").is_dir()
    (exported / ".git").rmdir()
    (tmp_path / "latest").symlink_to(exported)  # a link to an export: the export is replaced, the link kept
    earlier = (exported / "model.safetensors").stat().st_ino
    run_cli("export", ckpt, tmp_path / "latest", "--overwrite", check=True)
    assert (tmp_path / "latest").is_symlink() and (exported / "model.safetensors").stat().st_ino != earlier
    under_a_file = target / "notes.txt" / "export"
    assert_one_line_error(run_cli("export", ckpt, under_a_file), 2, "notes.txt is a file, not a folder")
    (tmp_path / "empty").mkdir()  # an empty folder is taken, moved aside as an old export is
    run_cli("export", ckpt, tmp_path / "empty", check=True)
    assert (tmp_path / "empty" / "model.safetensors").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp or old folder left


def test_runtime_flags_are_checked_before_any_work(tmp_path, tiny_checkpoint):
    ckpt = tiny_checkpoint
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "ort.wasm.min.js").write_text("// not all of it")
    result = run_cli("export", ckpt, tmp_path / "w", "--web", "--runtime", dist)
    assert_one_line_error(result, 2, "ort-wasm-simd-threaded.mjs", "npm install onnxruntime-web")
    assert_one_line_error(run_cli("export", ckpt, tmp_path / "w", "--runtime", dist), 2, "add --web")
    assert_one_line_error(run_cli("export", ckpt, tmp_path / "w", "--format", "onnx", "--runtime", dist), 2, "--web")
    assert not (tmp_path / "w").exists()
