"""The encoder-decoder (model.arch: encoder-decoder) on paired data: it learns a transduction that needs its
cross-attention, decodes greedily and by beam, is scored, counted, resumed exactly, exported, and refused politely."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_one_line_error,
    assert_resume_is_exact,
    callers_signal_handlers,
    handlers_are,
    run_cli,
    train_cli,
    with_token_shift_weights,
)

import charlm
from charlm.config.build import load_config
from charlm.data.pairs import pad_batch
from charlm.data.tokenizer import BOS, EOS, PAD
from charlm.decoding.options import DecodeOptions
from charlm.decoding.rewrite import beam_search, rewrite
from charlm.errors import UsageError
from charlm.evaluation.transduction import edit_distance
from charlm.families.registry import model_info
from charlm.models.encoder_decoder import EncoderDecoder

PAIRS = ["--set", "model.arch=encoder-decoder", "--set", "data.format=pairs"]
SHAPE = [
    *PAIRS,
    "--set",
    "model.n_layer=2",
    "--set",
    "model.n_embd=64",
    "--set",
    "model.n_head=4",
    "--set",
    "model.block_size=16",
    "--set",
    "model.pos_encoding=learned",
    "--set",
    "train.batch_size=64",
    "--set",
    "train.warmup_steps=50",
    "--set",
    "train.eval_interval=100",
    "--set",
    "train.max_seconds=0",  # cpu.yaml's time budget off: steps alone end a run and decay its lr, at any speed
]


def reversal_file(path: Path, lines: int = 6000, seed: int = 0) -> Path:
    """Random strings of 3 to 8 letters and their reversals: no target can be guessed without reading its source."""
    r = random.Random(seed)
    words = ["".join(r.choice("abcdefghij") for _ in range(r.randint(3, 8))) for _ in range(lines)]
    path.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reversal(tmp_path_factory) -> Path:
    return reversal_file(tmp_path_factory.mktemp("pairs") / "reverse.tsv")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, reversal) -> tuple[Path, dict]:
    run = tmp_path_factory.mktemp("encdec") / "run"
    # 400 steps and no time budget: what the model learns does not depend on the machine's speed (docs/rewriting.md
    # gives the time they take on a CPU, under a minute); batches of 32 take it past 99% exact as 64 do, in less time
    sets = ["train.batch_size=32"]
    result = run_cli(*train_cli(reversal, run, steps=400, quiet=True, json=True, config=SHAPE, sets=sets), check=True)
    return run, json.loads(result.stdout.strip().splitlines()[-1])


def eval_json(run: Path, *args: str) -> dict:
    return json.loads(run_cli("eval", run, "--json", *args, check=True).stdout)


def with_each_letter_changed(run: Path) -> list[str]:
    """The greedy targets of "abcdefgh" with its letter j made a "j", for j = 0..7: reversing, the "j" is written at
    7 - j, which only the cross-attention can carry there; a decoder that never reads the source writes one target."""
    targets = charlm.load(run).transduce(["abcdefgh"[:j] + "j" + "abcdefgh"[j + 1 :] for j in range(8)])
    assert isinstance(targets, list)  # a list of sources: a list of targets
    return targets


def test_reversal_is_learned_within_60_s_and_not_without_cross_attention(trained, reversal, tmp_path):
    run, summary = trained
    assert summary["steps"] == 400 and summary["stop_reason"] == "max_steps"
    scored = eval_json(run)
    # the validation split is 10% of the distinct words (a repeated word's lines stay together), all its lines scored
    assert scored["exact_match"] >= 0.99 and 540 <= scored["sources"] <= 600 and scored["lines"] >= scored["sources"]
    blind = tmp_path / "blind"
    no_cross_attention = ["model.cross_attention=false"]
    # 200 steps take the model with cross-attention past 90% exact; the same decoder, not told the source, cannot
    run_cli(*train_cli(reversal, blind, steps=200, quiet=True, config=SHAPE, sets=no_cross_attention), check=True)
    assert eval_json(blind)["exact_match"] < 0.05
    assert len(set(with_each_letter_changed(blind))) == 1  # no source letter changes what it writes
    no_cross = run_cli("attention", blind, "--prompt", "abc", "--json")
    assert_one_line_error(no_cross, 2, "no cross attention", "--part encoder|decoder")


def test_a_source_or_replacement_that_is_padding_start_or_end_is_named_in_one_line(trained):
    run, _ = trained
    result = run_cli("sample", run, "--prompt", "ab\x02c")
    assert_one_line_error(result, 2, "a source may not hold U+0000, U+0002, U+0003")
    result = run_cli("sample", run, "--prompt", "abz", "--unknown", "replace", "--replace-with", "\x00")
    assert_one_line_error(result, 2, "the replacement character U+0000 is one of the model's padding, start and end")


def test_eval_says_the_lines_a_skipping_model_leaves_out(trained, tmp_path):
    """A model trained with data.skip_bad_lines skips a line without a tab in the file it scores: said, never
    silent, on the terminal and in --json."""
    run, _ = trained
    state = torch.load(run / "best.pt", weights_only=True)
    state["config"]["data"]["skip_bad_lines"] = True
    torch.save(state, tmp_path / "skipping.pt")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("abc\tcba\nno tab\nabcd\tdcba\n", encoding="utf-8")
    said = run_cli("eval", tmp_path / "skipping.pt", "--data", pairs, check=True)
    assert "all of" in said.stdout and "2 lines" in said.stdout
    assert "skipping 1 line of" in said.stderr and "without exactly one tab (line 2)" in said.stderr
    result = json.loads(run_cli("eval", tmp_path / "skipping.pt", "--data", pairs, "--json", check=True).stdout)
    assert result["lines"] == 2 and len(result["skipped"]) == 1


def test_sample_rewrites_one_source_or_every_line_greedy_or_by_beam(trained, tmp_path):
    run, _ = trained
    assert run_cli("sample", run, "--prompt", "abcdefg", check=True).stdout == "gfedcba\n"
    lines = tmp_path / "words.txt"
    lines.write_text("hijab\n\nabc\r\n", encoding="utf-8")
    out = run_cli("sample", run, "--prompt-file", lines, check=True).stdout
    assert out == "hijab\tbajih\nabc\tcba\n"  # blank lines skipped, CRLF taken
    by_beam = json.loads(run_cli("sample", run, "--prompt-file", lines, "--beam", "4", "--json", check=True).stdout)
    assert by_beam == {
        "targets": [{"source": "hijab", "target": "bajih"}, {"source": "abc", "target": "cba"}],
        "beam": 4,
        "runtime": "torch",
    }
    piped = run_cli("sample", run, "--prompt-file", "-", input="jihgf\n", check=True).stdout
    assert piped == "jihgf\tfghij\n"


def test_beam_search_is_no_worse_than_greedy_and_beam_1_is_greedy(trained):
    run, _ = trained
    greedy, beam = eval_json(run), eval_json(run, "--beam", "5")
    assert beam["beam"] == 5 and beam["exact_match"] >= greedy["exact_match"] - 0.005
    model = charlm.load(run)
    sources = ["abc", "jihgfedc", "aaaa", "bacd"]
    assert model.transduce(sources) == [s[::-1] for s in sources]
    ids = [model.encode_source(s) for s in sources]
    module = model.encoder_decoder
    for source, expected in zip(ids, rewrite(module, ids, DecodeOptions(temperature=0.0)), strict=True):
        assert beam_search(module, source, DecodeOptions(beam=3)) == expected


def test_a_seeded_sampled_decode_repeats_and_an_unseeded_one_does_not(trained):
    model = charlm.load(trained[0])
    a = model.transduce(["abcdef"] * 16, temperature=3.0, seed=3)
    assert a == model.transduce(["abcdef"] * 16, temperature=3.0, seed=3)
    assert a != model.transduce(["abcdef"] * 16, temperature=3.0, seed=4)
    assert model.transduce(["abcdef"] * 16, temperature=3.0) != model.transduce(["abcdef"] * 16, temperature=3.0)


def test_unknown_characters_replaced_never_become_padding(trained):
    model = charlm.load(trained[0])
    assert model.encode_source("abz", "replace") == model.encode_source("aba")  # the first real character
    assert model.encode_source("abz", "replace", "c") == model.encode_source("abc")
    with pytest.raises(UsageError, match=r"U\+0000 is one of the model.s padding, start and end symbols"):
        model.encode_source("abz", "replace", "\x00")
    with pytest.raises(UsageError, match="top_k"):
        model.transduce("abc", temperature=1.0, top_k=0)


def test_the_wrong_methods_and_flags_are_one_line_errors(trained, tiny_checkpoint, tmp_path):
    run, _ = trained
    with pytest.raises(UsageError, match="transduce"):
        charlm.load(run).generate("abc")
    with pytest.raises(UsageError, match="generate"):
        charlm.load(tiny_checkpoint).transduce("abc")
    model = charlm.load(run)
    for call, needle in (
        (lambda: model.transduce(5), "sources must be a string"),
        (lambda: model.transduce(["abc", 3]), "sources must be a string"),
        (lambda: model.transduction_attention(None), "source must be a string, got None"),
        (lambda: model.transduce("abc", ensemble=[str(run)]), "models loaded with charlm.load"),
        (lambda: model.evaluate_pairs(ensemble=model), "models loaded with charlm.load"),
        (lambda: model.rewrite(["abc"], {"beam": 3}), "options must be a charlm DecodeOptions"),
        (lambda: model.rewrite(["abc"], DecodeOptions(stop=["c"])), "stop, num_samples and compile"),
        (lambda: model.rewrite(["abc"], DecodeOptions(num_samples=2)), "stop, num_samples and compile"),
        (lambda: model.item_counts(["abc"]), "not a lines model"),
        (lambda: model.require("encoder"), "kind must be one of decoder, encoder-decoder, lines"),
    ):
        with pytest.raises(UsageError, match=needle):
            call()
    # rewrite is transduce with one DecodeOptions: none is greedy and whole, a record is taken as it is
    assert model.rewrite("abcdef") == [model.transduce("abcdef")]
    beam = DecodeOptions(beam=3, temperature=0.0, max_new_tokens=16)
    assert model.rewrite(["abc", "hgf"], beam) == model.transduce(["abc", "hgf"], beam=3)
    assert_one_line_error(run_cli("sample", run, "--prompt", "abc", "--num-samples", "2"), 2, "--num-samples")
    assert_one_line_error(run_cli("sample", run, "--prompt", "abc", "--novel"), 2, "--novel", "data.format lines")
    assert_one_line_error(run_cli("sample", run), 2, "needs a source")
    assert_one_line_error(run_cli("sample", run, "--prompt", "a" * 17), 2, "1 to 16 characters")
    assert_one_line_error(run_cli("sample", run, "--prompt", "xyz"), 2, "not in the model's vocabulary")
    assert_one_line_error(run_cli("sample", run, "--prompt", "abc", "--beam", "3", "--temperature", "1"), 2, "beam")
    assert_one_line_error(run_cli("sample", tiny_checkpoint, "--beam", "2"), 2, "--beam is for encoder-decoder")
    assert_one_line_error(run_cli("eval", run, "--stride", "4"), 2, "--stride")
    bad = tmp_path / "notab.tsv"  # eval cannot set data.skip_bad_lines: it is not offered
    bad.write_text("abc\tcba\nabc\n", encoding="utf-8")
    refused = run_cli("eval", run, "--data", bad)
    assert_one_line_error(refused, 2, "1 without exactly one tab (line 2)", "fix or remove them")
    assert "skip_bad_lines=true" not in refused.stderr


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        ("abc\tcba\nabc\n", "1 without exactly one tab (line 2)"),
        ("abc\tcba\na\tb\tc\n", "1 without exactly one tab (line 2)"),
        ("abc\t\n\tx\nabc\tcba\n", "2 with an empty side (lines 1, 2)"),
        ("abc\tcba\n" + "a" * 17 + "\tb\n", "1 longer than the context"),
    ],
)
def test_bad_lines_are_counted_named_and_refused_or_skipped(tmp_path, lines, needle):
    data = tmp_path / "pairs.tsv"
    good = "".join(f"a{x}{y}\t{y}{x}a\n" for x in "bcde" for y in "bcdefghijk")  # 40 words: a split of sources
    data.write_text(lines + good, encoding="utf-8")
    result = run_cli(*train_cli(data, tmp_path / "run", steps=2, config=SHAPE))
    assert_one_line_error(result, 2, needle, "data.skip_bad_lines=true")
    assert not (tmp_path / "run").exists()
    skipped = run_cli(*train_cli(data, tmp_path / "run", steps=2, config=SHAPE, sets=["data.skip_bad_lines=true"]))
    assert skipped.returncode == 0, skipped.stderr
    assert "skipping" in skipped.stderr + skipped.stdout


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["--set", "model.arch=encoder-decoder"], "data.format=pairs"),
        (["--set", "data.format=pairs"], "needs model.arch encoder-decoder"),
        ([*PAIRS, "--set", "data.tokenizer=byte"], "reads characters"),
        ([*PAIRS, "--set", "model.n_experts=4"], "dense feed-forward"),
        (["--set", "model.cross_attention=false"], "model.cross_attention is for model.arch encoder-decoder"),
        (["--set", "model.arch=encoder", "--set", "model.n_encoder_layer=2"], "model.n_encoder_layer is for"),
        (["--set", "model.arch=encoder", "--set", "data.tokenizer=byte"], "an encoder reads characters"),
    ],
)
def test_inconsistent_settings_are_refused_before_any_work(tmp_path, reversal, sets, needle):
    result = run_cli(*train_cli(reversal, tmp_path / "run", steps=1, config=sets))  # no --config: cpu.yaml
    assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_resume_is_exact_per_step_losses_and_final_weights(tmp_path, reversal):
    sets = ["train.eval_interval=3", "model.dropout=0.2", "train.log_interval=1"]  # every step's loss compared
    common = train_cli(reversal, config=SHAPE, sets=sets)
    assert_resume_is_exact(common, tmp_path)


def test_hostile_and_mismatched_checkpoints_are_refused(trained, tmp_path):
    run, _ = trained
    state = torch.load(run / "best.pt", weights_only=True)
    state["config"]["model"]["arch"] = "decoder"  # encoder-decoder weights under a decoder's config
    state["config"]["data"]["format"] = "text"
    torch.save(state, tmp_path / "mismatch.pt")
    assert_one_line_error(run_cli("sample", tmp_path / "mismatch.pt"), 2, "does not match its recorded model shape")
    state = torch.load(run / "best.pt", weights_only=True)
    state["model"]["decoder.0.cross.q.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "nan.pt")
    assert_one_line_error(run_cli("eval", tmp_path / "nan.pt"), 2, "non-finite weights")


def test_init_from_an_encoder_decoder_or_into_one_names_the_cause(trained, reversal, corpus, tmp_path):
    run, _ = trained
    into = train_cli(reversal, tmp_path / "a", steps=2, config=SHAPE, init_from=run)
    assert_one_line_error(run_cli(*into), 2, "--init-from starts from a text model; an encoder-decoder run")
    onto_text = train_cli(corpus, tmp_path / "b", steps=2, init_from=run)
    assert_one_line_error(run_cli(*onto_text), 2, "--init-from starts from a text model", "is an encoder-decoder")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_export_loads_and_rewrites_identically(trained, tmp_path):
    pytest.importorskip("safetensors")
    run, _ = trained
    run_cli("export", run, tmp_path / "export", check=True)
    card = (tmp_path / "export" / "README.md").read_text()
    assert "encoder-decoder" in card and "exact match" in card
    sources = ["abc", "jihgfedc", "bacd"]
    original, exported = charlm.load(run), charlm.load(tmp_path / "export")
    assert exported.transduce(sources, beam=3) == original.transduce(sources, beam=3)
    for name, tensor in original.module.state_dict().items():
        assert torch.equal(tensor, exported.module.state_dict()[name]), name


def test_training_from_python_leaves_the_signal_handlers_alone(tmp_path, reversal):
    with callers_signal_handlers() as mine:
        overrides = {
            "model.arch": "encoder-decoder",
            "data.format": "pairs",
            "model.block_size": 16,
            "train.max_steps": 5,
        }
        summary = charlm.train("tiny", overrides, data=reversal, out_dir=tmp_path / "run", quiet=True)
        assert summary["steps"] == 5
        assert handlers_are(mine)


# The parts, directly ---------------------------------------------------------------------------------------------


def small(**changes) -> EncoderDecoder:
    sets = [f"model.{k}={v}" for k, v in changes.items()]
    config = load_config(None, ["model.arch=encoder-decoder", "data.format=pairs", "model.n_embd=32", *sets])
    torch.manual_seed(0)
    model = EncoderDecoder(config.model, 20).eval()
    return with_token_shift_weights(model) if config.model.token_shift else model


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"norm_position": "post", "pos_encoding": "sinusoidal"},
        {"share_embeddings": "false", "tie_weights": "false", "head_bias": "true", "n_encoder_layer": 3},
        {"activation": "swiglu", "bias": "false", "norm": "rmsnorm", "pos_encoding": "rope"},
        {"cross_attention": "false", "pos_encoding": "alibi"},
        {"token_shift": "true"},
    ],
)
def test_info_counts_every_parameter(changes):
    model = small(**changes)
    assert model_info(model.config, 20).total_params == sum(p.numel() for p in model.parameters())


def test_info_gives_the_classic_base_models_counts():
    base = ["model.arch=encoder-decoder", "data.format=pairs", "model.norm_position=pre", "model.activation=relu"]
    base += ["model.n_layer=6", "model.n_embd=512", "model.n_head=8", "model.pos_encoding=sinusoidal"]
    per_layer = model_info(load_config(None, base).model, 37000)
    encoder_layer = sum(r.params for r in per_layer.rows if r.per_layer and r.stack == "encoder")
    assert encoder_layer == 3_152_384  # the Pre-LN text's per-layer figure, biases included
    assert per_layer.total_params == 63_084_544  # the paper's "65M": shared 37k vocabulary, tied head
    separate = base + ["model.share_embeddings=false", "model.tie_weights=false", "model.head_bias=true"]
    assert model_info(load_config(None, separate).model, 32000).total_params == 93_324_544  # nn.Transformer + 3 tables


@pytest.mark.parametrize(
    ("pos_encoding", "token_shift"),
    [("learned", False), ("sinusoidal", False), ("rope", False), ("alibi", False), ("learned", True), ("rope", True)],
)
def test_padding_changes_nothing_and_the_cache_matches_the_full_pass(pos_encoding, token_shift):
    model = small(pos_encoding=pos_encoding, dropout=0.0, token_shift=token_shift)
    pairs = [([3, 4, 5], [6, 7]), ([8, 9, 10, 11, 12, 13], [14, 15, 16, 17])]
    (src, tgt_in), _ = pad_batch(pairs, torch.device("cpu"))
    with torch.no_grad():
        together = model(src, tgt_in)[0]
        alone = model(src[:1, :3], tgt_in[:1, :3])[0]
        assert torch.allclose(together[0, :3], alone[0], atol=1e-5)  # the second row's padding is invisible
        encoded, mask = model.encode(src)
        memory, cache = model.memory(encoded), model.new_cache(2, torch.device("cpu"))
        stepped = torch.cat([model.decode(tgt_in[:, t : t + 1], memory, mask, cache) for t in range(5)], dim=1)
        assert torch.allclose(stepped, together, atol=1e-5)


@torch.no_grad()
def test_a_cache_reordered_for_beams_continues_each_kept_row():
    """select_rows (beam search's reordering) moves each row's keys, values and token-shift memory together."""
    model = small(pos_encoding="rope", token_shift=True)
    src = torch.tensor([[3, 4, 5], [3, 4, 5]])
    tgt = torch.tensor([[BOS, 6, 7, 8], [BOS, 9, 8, 7]])
    encoded, mask = model.encode(src)
    memory, cache = model.memory(encoded), model.new_cache(2, torch.device("cpu"))
    model.decode(tgt[:, :3], memory, mask, cache)
    cache.select_rows(torch.tensor([1, 0]))  # the beams swap rows
    swapped = tgt.flip(0)
    stepped = model.decode(swapped[:, 3:], memory, mask, cache)[:, -1]
    torch.testing.assert_close(stepped, model(src, swapped)[0][:, -1], rtol=1e-4, atol=1e-5)


def test_attention_maps_cover_encoder_decoder_and_cross_with_padding_unseen():
    model = small()
    (src, tgt_in), _ = pad_batch([([3, 4, 5], [6, 7]), ([8, 9, 10, 11, 12], [14])], torch.device("cpu"))
    maps = model.attention_weights(src, tgt_in)
    L, nh = model.config.n_layer, model.config.n_head
    assert maps["encoder"].shape == (L, 2, nh, 5, 5) and maps["decoder"].shape == (L, 2, nh, 3, 3)
    assert maps["cross"].shape == (L, 2, nh, 3, 5)
    for weights in maps.values():
        assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)
    assert (maps["cross"][:, 0, :, :, 3:] == 0).all() and (maps["encoder"][:, 0, :, :, 3:] == 0).all()
    assert (maps["decoder"][:, :, :, 0, 1:] == 0).all()  # causal: the first target position sees itself alone
    assert (maps["encoder"][:, 1] > 0).all()  # both ways: every real character sees every other


def test_special_ids_and_edit_distance():
    assert (PAD, BOS, EOS) == (0, 1, 2)
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert edit_distance(["K", "AE1", "T"], ["K", "AH0", "T", "S"]) == 2
    assert edit_distance([], list("abc")) == 3


def test_attention_command_shows_the_cross_attention_alignment(trained, tmp_path):
    run, _ = trained
    shown = json.loads(run_cli("attention", run, "--prompt", "abcdefgh", "--json", check=True).stdout)
    assert shown["part"] == "cross" and shown["source"] == list("abcdefgh")
    assert shown["chars"] == [*"hgfedcba", "⟨end⟩"] and shown["key_chars"] == list("abcdefgh")
    weights = torch.tensor(shown["weights"])  # (L, nh, T, S)
    assert weights.shape == (2, 4, 9, 8)
    # Reversing, the map as a whole (every layer and head averaged) reads the source backwards: the source position
    # each written character attends to on average runs from the source's end to its start, and the letter it copies
    # gets well above the uniform 1/8. Which single head aligns, and how sharply, differs from run to run (seed,
    # bfloat16, the CPU's kernels), so no one head is asked for. On 8 runs (4 more seeds, bfloat16, torch's or oneDNN's
    # float32 kernels) x 5 sources: correlation 0.98-0.997, weight 0.245-0.28; a model trained to copy instead gives
    # -0.995 and 0.04, one trained for 1 step 0.32 and 0.125.
    mean = weights[:, :, :8].mean((0, 1))  # (T, S): written characters before the end, source letters
    position, mirrored = torch.arange(8.0), [7 - i for i in range(8)]
    attended = mean @ position  # each written character's mean attended source position
    assert torch.corrcoef(torch.stack([attended, 7 - position]))[0, 1] > 0.9
    assert mean[range(8), mirrored].mean() > 1.5 / 8
    # and what it shows is what the output depends on: change source letter j and written character 7 - j changes
    changed = with_each_letter_changed(run)
    assert all(len(target) == 8 and target[7 - j] == "j" for j, target in enumerate(changed)), changed
    decoder = json.loads(run_cli("attention", run, "--prompt", "abc", "--part", "decoder", "--json").stdout)
    assert (
        decoder["key_chars"] == ["⟨start⟩", "c", "b", "a"] and torch.tensor(decoder["weights"])[0, 0, 0, 1:].eq(0).all()
    )
    png = run_cli("attention", run, "--prompt", "abcd", "--part", "encoder", "-o", tmp_path / "enc.png")
    assert png.returncode == 0 and (tmp_path / "enc.png").read_bytes()[:4] == b"\x89PNG"


def test_muon_takes_both_stacks_matrices():
    from charlm.training.optim import hidden_matrices

    model = small()
    # encoder blocks: Q, K/V, W_O, two feed-forward; decoder blocks: QKV, W_O, cross Q, K/V, W_O, two feed-forward
    assert len(hidden_matrices(model)) == 5 * len(model.encoder) + 7 * len(model.decoder)
    assert all(p.dim() == 2 for p in hidden_matrices(model))


@pytest.mark.parametrize("token_shift", [False, True])
def test_beam_search_finds_the_best_ending_hypothesis_of_an_untrained_model(token_shift):
    """With a beam as wide as every hypothesis, beam search is exhaustive: it must return the target whose mean
    log-probability per character (its end included) is highest, never a hypothesis cut off by the length limit
    unless its own end scores best, and never padding or start symbols. With token shift, the surviving beams'
    cache rows keep their own last embeddings."""
    import itertools
    import math

    config = load_config(None, ["model.arch=encoder-decoder", "data.format=pairs", "model.n_embd=16"])
    config.model.block_size, config.model.n_head, config.model.token_shift = 4, 2, token_shift
    torch.manual_seed(1)
    model = EncoderDecoder(config.model, 5).eval()  # ids 3 and 4 are the only real characters
    if token_shift:
        with_token_shift_weights(model, seed=1)
    source = [3, 4, 4]

    @torch.no_grad()
    def mean_logprob(target):
        ids = torch.tensor([[BOS, *target]])
        logits = model(torch.tensor([source]), ids)[0][0].float()
        logits[:, [PAD, BOS]] = -math.inf
        logp = torch.log_softmax(logits, -1)
        return sum(float(logp[i, t]) for i, t in enumerate([*target, EOS])) / (len(target) + 1)

    candidates = [list(c) for n in range(4) for c in itertools.product([3, 4], repeat=n)]  # up to block_size - 1
    best = max(candidates, key=mean_logprob)
    with torch.no_grad():
        assert beam_search(model, source, DecodeOptions(beam=16)) == best
