"""Item lists (data.format lines): items never see each other, the split never cuts one, sampling ends at the end
symbol, --novel, empty and over-long lines, unknown prompt characters, eval's measure by hand, charlm score, and the
server's completion of a lines model."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import assert_one_line_error, run_cli, train_cli

from charlm.config.schema import DataConfig, ModelConfig
from charlm.data.lines import LineBatches, LineCorpus, frame
from charlm.data.tokenizer import BOS, EOS, PAD, CharTokenizer
from charlm.decoding.items import ItemFrame, sample_items
from charlm.decoding.options import DecodeOptions
from charlm.errors import UsageError
from charlm.evaluation.items import item_logprobs
from charlm.models.decoder import Decoder

NAMES_TEXT = """emma olivia ava isabella sophia charlotte mia amelia harper evelyn abigail emily elizabeth mila ella
avery sofia camila aria scarlett victoria madison luna grace chloe penelope layla riley zoey nora
lily eleanor hannah lillian addison aubrey ellie stella natalie zoe leah hazel violet aurora
savannah audrey brooklyn bella claire skylar lucy paisley everly anna caroline nova genesis emilia
kennedy samantha maya willow kinsley naomi aaliyah elena sarah ariana allison gabriella alice
madelyn cora ruby eva serenity autumn adeline hailey gianna valentina isla eliana quinn nevaeh ivy
sadie piper lydia alexa josephine emery julia delilah arianna vivian kaylee sophie brielle madeline"""
NAMES = NAMES_TEXT.split()
BLOCK = 16  # items of up to 15 characters
LINES_RUN = {"data.format": "lines", "model.block_size": BLOCK, "train.lr": 0.01, "train.eval_windows": 64}


def small_gpt(**changes) -> Decoder:
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, **changes)
    return Decoder(config, 30).eval()


@pytest.fixture(scope="module")
def names_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lines") / "names.txt"
    path.write_text("\n".join(NAMES) + "\n")
    return path


@pytest.fixture(scope="module")
def lines_run(names_file):
    """A lines model trained for a few seconds on NAMES (long enough to learn some of them by heart)."""
    run = names_file.parent / "run"
    run_cli(*train_cli(names_file, run, steps=300, quiet=True, sets=LINES_RUN), check=True)
    return run


# -- items never see each other ---------------------------------------------------------------------


@pytest.mark.parametrize("changes", [{}, {"pos_encoding": "rope", "token_shift": True}])
def test_no_item_sees_another_in_a_batch(changes):
    """An item's logits, and the gradient of its loss, are the same whatever it is batched with: each item is its own
    row, so attention (causal, over its own row) never reaches another item or the padding."""
    model = small_gpt(**changes)
    item, short_neighbour, long_neighbour = [5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17, 18]
    alone = model(frame([item])[0])[0][0]  # (T, V)
    for neighbour in (short_neighbour, long_neighbour):
        x, _ = frame([item, neighbour])
        assert torch.allclose(model(x)[0][0, : len(item) + 1], alone, atol=1e-5)
    # the gradient of one item's loss reaches none of the other item's inputs (its embedded characters)
    embedded: list[torch.Tensor] = []
    model.tok_emb.register_forward_hook(lambda module, args, out: embedded.append(out) or out.retain_grad())
    x, y = frame([item, long_neighbour])
    logits = model(x)[0]
    torch.nn.functional.cross_entropy(logits[0], y[0], ignore_index=-100).backward()
    grad = embedded[0].grad  # (2, T, C)
    assert grad[1].abs().sum() == 0 and grad[0, : len(item) + 1].abs().sum() > 0


def test_an_items_log_likelihood_does_not_depend_on_its_batch():
    model = small_gpt()
    items = [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14], [5, 6, 7]]
    together = item_logprobs(model, items, torch.device("cpu"), batch_size=4)
    apart = [item_logprobs(model, [item], torch.device("cpu"))[0] for item in items]
    assert together == pytest.approx(apart, abs=1e-4)
    assert together[0] == pytest.approx(together[3], abs=1e-6)


def test_batches_are_whole_items_framed_by_the_special_ids():
    items = [[3 + (i % 7)] * (1 + i % 9) for i in range(50)]
    batches = LineBatches(items, 8, torch.device("cpu"), seed=0)
    for _ in range(7):  # a whole pass: every item once
        x, y = batches.next_batch()
        assert (x[:, 0] == BOS).all()
        for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
            n = row_y.index(EOS)  # the item's length: its characters, then the end symbol, then nothing scored
            assert row_x[1 : n + 1] == row_y[:n] and set(row_y[n + 1 :]) <= {-100} and set(row_x[n + 1 :]) <= {PAD}
            assert row_y[:n] in items
        assert batches.last_tokens == int((y != -100).sum())


# -- the split and the file's rules -------------------------------------------------------------------


def test_the_split_never_cuts_an_item_and_counts_items(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("\n".join(NAMES) + "\n")
    data = DataConfig(path=str(path), format="lines", val_fraction=0.1, test_size=7)
    corpus = LineCorpus.from_config(data, BLOCK)
    decoded = [corpus.tokenizer.decode(item) for item in corpus.train + corpus.val + corpus.test]
    assert sorted(decoded) == sorted(NAMES)  # every item whole, in exactly one split
    assert len(corpus.test) == 7 and len(corpus.val) == len(NAMES) - int(len(NAMES) * 0.9)
    assert corpus.tokenizer.chars[:3] == ["\x00", "\x02", "\x03"]  # PAD, BOS, EOS: ids 0, 1, 2
    again = LineCorpus.from_config(data, BLOCK)
    assert again.val == corpus.val  # the seeded shuffle: the same split every time


def test_empty_lines_are_skipped_and_a_line_too_long_is_refused_or_skipped(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("anna\n\n   \nbob\r\n  carl  \n" + "x" * BLOCK + "\ndora\n")
    refused = run_cli(*train_cli(path, tmp_path / "run", steps=2, sets=LINES_RUN))
    assert_one_line_error(refused, 2, "names.txt", "longer than the context", "line 6", "data.skip_bad_lines")
    assert "raise model.block_size" in refused.stderr
    reserved = tmp_path / "reserved.txt"  # a control character the model keeps for its own symbols: no context helps
    reserved.write_text("anna\nb\x03ob\ncarl\n")
    refused = run_cli(*train_cli(reserved, tmp_path / "run", steps=2, sets=LINES_RUN))
    assert_one_line_error(refused, 2, "reserved control character", "line 2", "take the control characters out")
    assert "block_size" not in refused.stderr
    data = DataConfig(path=str(path), format="lines", val_size=1, skip_bad_lines=True)
    said: list[str] = []
    corpus = LineCorpus.from_config(data, BLOCK, say=said.append)
    assert sorted(corpus.tokenizer.decode(i) for i in corpus.split("all")) == ["anna", "bob", "carl", "dora"]
    assert said and "line 6" in said[0]
    # an item of exactly the room the context leaves (block_size - 1) is kept
    path.write_text("x" * (BLOCK - 1) + "\nanna\nbob\n")
    assert len(LineCorpus.from_config(DataConfig(path=str(path), format="lines", val_size=1), BLOCK).train) == 2
    # a given validation file's bad line gets the training advice (not the one for unseen characters)
    given = tmp_path / "val.txt"
    given.write_text("anna\n" + "x" * BLOCK + "\n")
    with pytest.raises(UsageError, match="line 2.*data.skip_bad_lines=true to train on the rest"):
        LineCorpus.from_config(DataConfig(path=str(path), format="lines", val_path=str(given)), BLOCK).split("val")
    # a byte-order mark (a Windows editor's, a spreadsheet's) is no character of the first item
    path.write_text("\ufeffanna\nbob\n", encoding="utf-8")
    corpus = LineCorpus.from_config(DataConfig(path=str(path), format="lines", val_size=1), BLOCK)
    assert "\ufeff" not in corpus.tokenizer.chars and "anna" in corpus.texts("all")


def test_an_encoder_on_lines_and_lines_of_bytes_are_refused_in_one_line(names_file, tmp_path):
    encoder = run_cli(*train_cli(names_file, tmp_path / "a", steps=2, sets={**LINES_RUN, "model.arch": "encoder"}))
    assert_one_line_error(encoder, 2, "data.format lines is for model.arch decoder")
    byte = run_cli(*train_cli(names_file, tmp_path / "b", steps=2, sets={**LINES_RUN, "data.tokenizer": "byte"}))
    assert_one_line_error(byte, 2, "data.format lines reads characters")


# -- sampling ------------------------------------------------------------------------------------


def biased(model: Decoder, favourite: int, vocab: int = 30) -> Decoder:
    """The model with an output bias that makes `favourite` by far the likeliest next id everywhere."""
    model.head.bias = torch.nn.Parameter(torch.zeros(vocab))
    with torch.no_grad():
        model.head.bias[favourite] = 100.0
    return model


def test_sampling_ends_at_the_end_symbol_and_the_context_is_only_a_cap():
    tokenizer = CharTokenizer(["\x00", "\x02", "\x03", *"abcdefghijklmnopqrstuvwxyz0"])
    items_frame = ItemFrame(BOS, EOS, (PAD, BOS), BLOCK)
    options = DecodeOptions(num_samples=4, seed=0, temperature=1.0)
    ended = sample_items(biased(small_gpt(), EOS), tokenizer, items_frame, [3, 4], options)
    assert [(i.text, i.ended) for i in ended.items] == [("ab", "end")] * 4 and ended.drawn == 4
    # the start symbol is never drawn, however likely: the next likeliest character is, up to the context's cap
    capped = sample_items(biased(small_gpt(), BOS), tokenizer, items_frame, [3], options.with_(temperature=0))
    assert {i.ended for i in capped.items} == {"length"} and {len(i.text) for i in capped.items} == {BLOCK - 1}
    assert not any(c in i.text for i in capped.items for c in "\x00\x02\x03")
    short = sample_items(biased(small_gpt(), BOS), tokenizer, items_frame, [], options.with_(max_new_tokens=3))
    assert {len(i.text) for i in short.items} == {3}


def test_sample_prints_whole_items_with_their_log_likelihoods(lines_run):
    result = run_cli("sample", lines_run, "--num-samples", "20", "--seed", "1", "--json", check=True)
    items = json.loads(result.stdout)["items"]
    assert len(items) == 20
    for item in items:
        assert item["ended"] == "end" and "\n" not in item["text"] and "\x03" not in item["text"]
        assert item["logprob"] < 0 and item["per_char"] == pytest.approx(-item["logprob"] / (len(item["text"]) + 1))
    prefixed = run_cli("sample", lines_run, "--prompt", "el", "--num-samples", "5", "--seed", "2", check=True)
    assert [line[:2] for line in prefixed.stdout.splitlines()] == ["el"] * 5


def counts_line(result: dict) -> str:
    """The line on stderr that counts a sample's draws, as the JSON gives them."""
    return (
        f"{result['sampled']} samples: {result['training']} in training, {result['held_out']} held out "
        f"(validation/test), {result['new']} new"
    )


def test_novel_prints_only_items_in_no_split_and_draws_until_it_has_enough(lines_run):
    from charlm.api.entry import load

    model = load(lines_run, "cpu")
    corpus = LineCorpus.from_config(model.config.data, BLOCK, model.tokenizer)
    seen = corpus.texts("train") | corpus.texts("val")
    args = ("sample", lines_run, "--num-samples", "200", "--seed", "3", "--temperature", "0.5")
    every = [row["text"] for row in json.loads(run_cli(*args, "--json", check=True).stdout)["items"]]
    novel = json.loads(run_cli(*args, "--json", "--novel", check=True).stdout)
    kept = [row["text"] for row in novel["items"]]
    assert any(text in seen for text in every)  # the model does make the list's items: the filter has work to do
    first = [text for text in every if text not in seen]  # the first 200 draws are the same: then more are drawn
    assert len(kept) == 200 and kept[: len(first)] == first and not set(kept) & seen
    assert novel["new"] == 200 and novel["training"] + novel["held_out"] + novel["new"] == novel["sampled"] > 200
    printed = run_cli(*args, "--novel", check=True)
    assert printed.stdout.splitlines() == kept and counts_line(novel) in printed.stderr


# A list whose every item is made of a and b, up to 3 long: the model makes its held-out items as readily as its
# training items (they are all alike), and a 3-long item beginning with b is in no file: it is new.
AB_ITEMS = ["a", "b", "aa", "ba", "bb", "aaa", "aab", "aba"]  # data.path: 2 of them held out for validation
AB_TEST = ["ab", "abb"]  # data.test_path
AB_RUN = {"data.format": "lines", "model.block_size": 4, "train.lr": 0.01, "data.val_size": 2}


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory):
    """A lines model of AB_ITEMS, its validation split carved from them and its test split given as a file."""
    folder = tmp_path_factory.mktemp("ab")
    (folder / "ab.txt").write_text("\n".join(AB_ITEMS) + "\n")
    (folder / "test.txt").write_text("\n".join(AB_TEST) + "\n")
    sets = {**AB_RUN, "data.test_path": folder / "test.txt"}
    run_cli(*train_cli(folder / "ab.txt", folder / "run", steps=60, quiet=True, sets=sets), check=True)
    return folder / "run"


def ab_splits(run) -> tuple[set[str], set[str]]:
    """The run's training items and its held-out ones (validation and test), read by hand."""
    from charlm.api.entry import load

    model = load(run, "cpu")
    corpus = LineCorpus.from_config(model.config.data, 4, model.tokenizer)
    return corpus.texts("train"), corpus.texts("val") | set(AB_TEST)


def test_sample_counts_training_held_out_and_new_and_novel_leaves_out_every_split(ab_run):
    train, held_out = ab_splits(ab_run)
    assert len(train) == 6 and len(held_out) == 4  # the validation split carved from the list, the test file given
    args = ("sample", ab_run, "--num-samples", "40", "--seed", "1", "--temperature", "1.5")
    drawn = json.loads(run_cli(*args, "--json", check=True).stdout)
    texts = [row["text"] for row in drawn["items"] if row["ended"] == "end" and row["text"]]  # whole items
    by_hand = {
        "training": sum(t in train for t in texts),
        "held_out": sum(t in held_out for t in texts),
        "new": sum(t not in train | held_out for t in texts),
    }
    assert {key: drawn[key] for key in by_hand} == by_hand and by_hand["new"] + by_hand["training"] > 20
    assert drawn["sampled"] == sum(by_hand.values()) + drawn.get("unfinished", 0) == 40
    assert by_hand["held_out"] and by_hand["new"]  # held-out items are drawn: --novel must leave them out too
    assert counts_line(drawn) in run_cli(*args, check=True).stderr
    novel = json.loads(run_cli(*args, "--novel", "--json", check=True).stdout)
    kept = [row["text"] for row in novel["items"]]
    assert len(kept) == 40 and not set(kept) & (train | held_out)
    # the same seed's draws first: the new ones among them that are whole items (ended, not empty)
    whole_new = [r["text"] for r in drawn["items"] if r["ended"] == "end" and r["text"] not in train | held_out | {""}]
    assert whole_new and kept[: len(whole_new)] == whole_new
    whole = novel["training"] + novel["held_out"] + novel["new"]
    assert whole + novel.get("unfinished", 0) == novel["sampled"] and novel["new"] == 40


def test_novel_gives_up_in_one_line_when_no_draw_is_new(ab_run):
    """Every item beginning with a and at most 3 long is in one of the run's files: no draw can be new."""
    result = run_cli("sample", ab_run, "--prompt", "a", "--max-new-tokens", "2", "--num-samples", "2", "--novel")
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    said = [line for line in result.stderr.splitlines() if line.strip()]
    assert said[0].startswith("100 samples: ") and " 0 new" in said[0] and said[0].endswith("(only the new printed)")
    assert said[1].startswith("error: only 0 of the 2 new items asked for in 100 samples") and len(said) == 2


def test_a_given_validation_file_is_held_out_and_a_file_gone_is_said(ab_run, tmp_path):
    """A run whose validation items come from their own file: --novel never prints one. Its files gone: said in one
    line, new then measured against what is left, and --novel refused when nothing is."""
    args = ("--num-samples", "20", "--seed", "1", "--temperature", "1.5")
    made = [row["text"] for row in json.loads(run_cli("sample", ab_run, *args, "--novel", "--json").stdout)["items"]]
    favourite = max(filter(None, made), key=made.count)  # the new item made most often (an empty line is no item)
    (tmp_path / "val.txt").write_text(f"{favourite}\n")
    state = torch.load(ab_run / "best.pt", weights_only=True)
    state["config"]["data"] |= {"val_path": str(tmp_path / "val.txt"), "test_path": str(tmp_path / "gone.txt")}
    torch.save(state, tmp_path / "given.pt")
    result = run_cli("sample", tmp_path / "given.pt", *args, "--novel", "--json", check=True)
    counted = json.loads(result.stdout)
    assert favourite not in {row["text"] for row in counted["items"]} and counted["held_out"] > 0
    assert f"data.test_path {tmp_path / 'gone.txt'} not found: new means not in the training split of " in result.stderr
    assert f"the validation file {tmp_path / 'val.txt'}" in result.stderr
    state["config"]["data"] |= {"path": str(tmp_path / "gone-list.txt"), "val_path": ""}
    torch.save(state, tmp_path / "gone.pt")
    refused = run_cli("sample", tmp_path / "gone.pt", "--novel")
    assert_one_line_error(refused, 2, "--novel", "none is still there", "gone-list.txt")
    plain = run_cli("sample", tmp_path / "gone.pt", *args, check=True)
    assert len(plain.stdout.splitlines()) == 20 and "samples not compared with the run's items" in plain.stderr


def test_a_prompt_with_characters_the_model_never_saw_is_refused_by_name(lines_run):
    refused = run_cli("sample", lines_run, "--prompt", "eZ")
    assert_one_line_error(refused, 2, "'Z' (U+005A)", "never seen")
    reserved = run_cli("sample", lines_run, "--prompt", "a\x03")
    assert_one_line_error(reserved, 2, "U+0003")
    too_long = run_cli("sample", lines_run, "--prompt", "a" * BLOCK)
    assert_one_line_error(too_long, 2, f"at most {BLOCK - 1}")


def test_an_empty_prompt_to_look_at_is_refused_in_one_line(lines_run):
    """A lines model's empty prompt holds no id at all (its start symbol is the model's own); the default prompt, a
    speaker of tiny-shakespeare, is not a list's: the line says it was the default and asks for one."""
    assert_one_line_error(run_cli("attention", lines_run, "--prompt", "", "--json"), 2, "the prompt is empty")
    default = run_cli("attention", lines_run, "--json")
    assert_one_line_error(default, 2, "the default --prompt 'ROMEO: '", "pass --prompt with a text in the model's")


def test_another_file_of_one_item_is_scored_whole(lines_run, tmp_path):
    """Scoring all of another file cuts no splits from it: one item leaves no training split, and needs none."""
    one = tmp_path / "one.txt"
    one.write_text(f"{NAMES[0]}\n")
    result = json.loads(run_cli("eval", lines_run, "--data", one, "--json", check=True).stdout)
    assert result["items"] == 1 and result["split"] == "all"


def test_eval_says_the_lines_a_skipping_model_leaves_out(lines_run, tmp_path):
    """A model trained with data.skip_bad_lines skips an over-long line of the file it scores: said, never silent."""
    state = torch.load(lines_run / "best.pt", weights_only=True)
    state["config"]["data"]["skip_bad_lines"] = True
    torch.save(state, tmp_path / "skipping.pt")
    names = tmp_path / "names.txt"
    names.write_text("\n".join([*NAMES[:5], "x" * BLOCK]) + "\n")
    said = run_cli("eval", tmp_path / "skipping.pt", "--data", names, check=True)
    assert "all of" in said.stdout and "5 items" in said.stdout
    assert "skipping 1 line of" in said.stderr and "(line 6)" in said.stderr
    result = json.loads(run_cli("eval", tmp_path / "skipping.pt", "--data", names, "--json", check=True).stdout)
    assert result["items"] == 5 and len(result["skipped"]) == 1


def test_novel_on_a_text_model_is_refused_in_one_line(tiny_checkpoint):
    assert_one_line_error(run_cli("sample", tiny_checkpoint, "--novel"), 2, "--novel", "data.format lines")


# -- eval and score ------------------------------------------------------------------------------


def test_eval_loss_per_character_counts_the_end_symbol(lines_run):
    """charlm eval's loss, by hand: -ln p of every character and of the end symbol after it, from the start symbol,
    over the validation items, divided by their characters plus one end symbol each."""
    from charlm.api.entry import load

    result = json.loads(run_cli("eval", lines_run, "--json", check=True).stdout)
    model = load(lines_run, "cpu")
    val = LineCorpus.from_config(model.config.data, BLOCK, model.tokenizer).val
    total, count = 0.0, 0
    with torch.no_grad():
        for item in val:
            logits = model.module(torch.tensor([[BOS, *item]]))[0][0]  # (len + 1, V)
            logp = torch.log_softmax(logits.double(), dim=-1)
            total -= sum(float(logp[t, target]) for t, target in enumerate([*item, EOS]))
            count += len(item) + 1
    assert result["chars"] == count and result["items"] == len(val)
    assert result["loss"] == pytest.approx(total / count, abs=1e-5)
    assert result["mean_logprob"] == pytest.approx(-total / len(val), abs=1e-4)
    without_end = sum(len(item) for item in val)
    assert result["chars"] == without_end + len(val)  # one end symbol per item, counted as a character


def test_score_gives_each_line_its_log_likelihood_in_order_or_ranked(lines_run, tmp_path):
    from charlm.api.entry import load

    candidates = tmp_path / "candidates.txt"
    candidates.write_text("emma\n\nqzxv\nolivia\n")
    scored = json.loads(run_cli("score", candidates, lines_run, "--json", check=True).stdout)
    assert [s["item"] for s in scored["scores"]] == ["emma", "qzxv", "olivia"]  # the empty line skipped
    model = load(lines_run, "cpu")
    expected = item_logprobs(model.module, [model.tokenizer.encode(s) for s in ("emma", "qzxv", "olivia")], "cpu")
    assert [s["logprob"] for s in scored["scores"]] == pytest.approx(expected, abs=1e-5)
    ranked = run_cli("score", candidates, lines_run, "--sort", check=True).stdout.splitlines()
    assert ranked[-1].endswith("\tqzxv")  # the made-up string is the least likely
    assert float(ranked[0].split("\t")[0]) >= float(ranked[1].split("\t")[0])
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("emma\nEmma\n")
    assert_one_line_error(run_cli("score", unknown, lines_run), 2, "line 2", "'E' (U+0045)")
    skipped = json.loads(run_cli("score", unknown, lines_run, "--unknown", "skip", "--json", check=True).stdout)
    assert [s["item"] for s in skipped["scores"]] == ["emma"]


def test_score_refuses_a_reserved_replacement_and_says_when_skip_left_out_every_line(lines_run, tmp_path):
    candidates = tmp_path / "c.txt"
    candidates.write_text("anna\nb€b\n")
    for reserved in ("\x00", "\x02", "\x03"):  # an end symbol inside an item would score it as two
        result = run_cli("score", candidates, lines_run, "--unknown", "replace", "--replace-with", reserved)
        needle = f"the replacement character U+{ord(reserved):04X} is one of the model's padding, start and end symbols"
        assert_one_line_error(result, 2, needle)
    # the same rule and words where a prompt is read
    result = run_cli("sample", lines_run, "--prompt", "an€", "--unknown", "replace", "--replace-with", "\x03")
    assert_one_line_error(result, 2, "the replacement character U+0003 is one of the model's padding, start and end")
    unseen = tmp_path / "unseen.txt"
    unseen.write_text("€\n€€\n")
    result = run_cli("score", unseen, lines_run, "--unknown", "skip")
    assert_one_line_error(result, 2, "--unknown skip left all 2 out", "--unknown replace")


def test_score_of_a_text_model_is_refused_in_one_line(tiny_checkpoint, tmp_path):
    candidates = tmp_path / "c.txt"
    candidates.write_text("a\n")
    assert_one_line_error(run_cli("score", candidates, tiny_checkpoint), 2, "not a lines model")


# -- the server ---------------------------------------------------------------------------------------


@pytest.mark.process
def test_the_servers_completion_of_a_lines_model_ends_at_the_end_symbol(lines_run):
    pytest.importorskip("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'")
    from serve_helpers import ServerProcess

    server = ServerProcess(lines_run)
    try:
        status, body = server.request("POST", "/v1/completions", {"n": 8, "max_tokens": 100, "seed": 4})
        assert status == 200, body
        for choice in body["choices"]:
            assert choice["finish_reason"] == "stop"  # the end symbol, drawn long before the cap
            assert choice["text"] and not set(choice["text"]) & set("\n\x00\x02\x03")
        status, body = server.request("POST", "/v1/completions", {"prompt": "ma", "max_tokens": 1, "n": 4})
        assert status == 200 and all(len(c["text"]) <= 1 for c in body["choices"])
        status, card = server.request("GET", "/v1/models")
        assert card["data"][0]["items"] is True
        status, scored = server.request("POST", "/v1/score", {"text": "emma"})
        assert status == 200 and scored["tokens"][-1] == "⟨end⟩" and len(scored["surprisal_bits"]) == 5
        assert None not in scored["surprisal_bits"]  # the first character is predicted from the start symbol
        assert math.isfinite(scored["nats_per_char"])
    finally:
        server.stop()
