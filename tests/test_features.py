"""A features column (data.columns): each feature one input of the encoder, never read as characters, through
training, eval, sample, the Python API, `charlm serve`, exports and an exact resume; malformed three-column files
refused naming their lines; features and characters of a dev file the training file lacks read as the unknown
symbol and counted."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, run_cli, skip_without, train_cli

import charlm
from charlm.storage.checkpoint import load_checkpoint

# A small model (tests/conftest.py's SMALL, as an encoder-decoder): what is under test is how features are read.
ENCDEC = ["--config", "tiny", "--set", "model.arch=encoder-decoder", "--set", "data.format=pairs"]
ENCDEC += ["--set", "model.n_layer=1", "--set", "model.n_encoder_layer=1", "--set", "model.n_embd=32"]
ENCDEC += ["--set", "model.n_head=2", "--set", "model.block_size=16", "--set", "train.batch_size=16"]
LAYOUT = ["--set", "data.columns=source-features-target"]
SUFFIX = {"V;PST": "d", "V;PRS": "s", "N;PL": "n", "N;SG": ""}  # an inflection the model can learn


def inflections(count: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(lemma, features, form) of lemmas spelled with the letters a-e and V: the letter and the tag V meet."""
    r = random.Random(seed)
    rows = []
    for _ in range(count):
        lemma = "".join(r.choice("abcdeV") for _ in range(r.randint(3, 6)))
        features = r.choice(sorted(SUFFIX))
        rows.append((lemma, features, lemma + SUFFIX[features]))
    return rows


def write_rows(path: Path, rows: list[tuple[str, ...]]) -> Path:
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def features_run(tmp_path_factory) -> tuple[Path, Path, object]:
    """A model trained on source<TAB>features<TAB>target lines, validated on a dev file holding a feature (FUT) and a
    character (z) the training file lacks, read as the unknown symbol it learns (data.unknown_dropout)."""
    tmp = tmp_path_factory.mktemp("features")
    train = write_rows(tmp / "train.tsv", inflections(400))
    dev = write_rows(tmp / "dev.tsv", [*inflections(20, seed=1), ("abc", "V;FUT", "abcd"), ("zab", "N;SG", "zab")])
    sets = {"data.val_path": dev, "data.unknown_dropout": 0.05, "train.eval_interval": 10}
    result = run_cli(*train_cli(train, tmp / "run", steps=20, config=ENCDEC + LAYOUT, sets=sets, json=True))
    assert result.returncode == 0, result.stderr
    return tmp / "run", dev, result


def test_each_feature_is_one_input_never_a_character(features_run):
    run, _, _ = features_run
    model = charlm.load(run)
    past, present = model.encode_source("aVb\tV;PST"), model.encode_source("aVb\tV;PRS")
    assert len(past) == len(present) == 5  # three characters, two features
    assert [i for i, (a, b) in enumerate(zip(past, present, strict=True)) if a != b] == [4]  # one tag, one input
    assert past[1] != past[3]  # the letter V and the feature V are different inputs
    assert model.transduction_attention("aVb\tV;PST")["source"] == ["a", "V", "b", "V", "PST"]
    assert sorted(model.tokenizer.features.model_tags()) == ["N", "PL", "PRS", "PST", "SG", "V"]
    wrong = {"aVb": "SOURCE<TAB>FEATURES", "\tV;PST": "both not empty", "aVb\t": "both not empty"}
    for source, said in {**wrong, "aVb\tV;XYZ": "feature 'XYZ'"}.items():
        assert_one_line_error(run_cli("sample", run, "--prompt", source), 2, said)


def test_a_dev_file_s_unseen_features_are_read_as_the_unknown_symbol_and_counted(features_run):
    run, dev, result = features_run
    said = f"{dev}: 2 characters and 1 feature the training file lacks, in 2 lines, read as the unknown symbol"
    assert said in result.stderr and "1 of those lines' targets hold one" in result.stderr  # zab's z
    expected = {"chars": 2, "lines": 2, "target_lines": 1, "features": 1}
    assert json.loads((run / "summary.json").read_text())["unseen_chars"] == {str(dev): expected}
    scored = json.loads(run_cli("eval", run, "--data", dev, "--json", check=True).stdout)
    assert (scored["unknown_chars"], scored["unknown_features"], scored["unknown_lines"]) == (2, 1, 2)
    assert scored["lines"] == 22


def test_sample_the_api_and_an_export_rewrite_covered_lines_in_the_task_s_format(features_run, tmp_path):
    run, _, _ = features_run
    covered = tmp_path / "covered.tsv"  # a shared task's test file without its forms
    covered.write_text("abc\tV;PST\nVead\tN;PL\n", encoding="utf-8")
    lines = run_cli("sample", run, "--prompt-file", covered, check=True).stdout.splitlines()
    forms = charlm.load(run).rewrite(["abc\tV;PST", "Vead\tN;PL"])
    assert lines == [f"abc\tV;PST\t{forms[0]}", f"Vead\tN;PL\t{forms[1]}"]  # lemma, features, form: a submission
    run_cli("export", run, tmp_path / "export", check=True)
    assert run_cli("sample", tmp_path / "export", "--prompt-file", covered, check=True).stdout.splitlines() == lines
    vocab = json.loads((tmp_path / "export" / "vocab.json").read_text())
    assert vocab["features"] == charlm.load(run).tokenizer.features.model_tags()
    del vocab["features"]  # a features model's vocabulary without their names: damaged, said in one line
    (tmp_path / "export" / "vocab.json").write_text(json.dumps(vocab))
    damaged = run_cli("sample", tmp_path / "export", "--prompt-file", covered)
    assert_one_line_error(damaged, 2, "its vocabulary lacks the features' names")


def test_unimorph_order_puts_the_features_last_in_and_out(tmp_path):
    rows = [(lemma, form, features) for lemma, features, form in inflections(100)]
    layout = ["--set", "data.columns=source-target-features"]
    run_cli(*train_cli(write_rows(tmp_path / "t.tsv", rows), tmp_path / "run", steps=3, config=ENCDEC + layout), check=True)  # fmt: skip # noqa: E501
    (tmp_path / "covered.tsv").write_text("abc\tV;PST\n", encoding="utf-8")
    line = run_cli("sample", tmp_path / "run", "--prompt-file", tmp_path / "covered.tsv", check=True).stdout
    lemma, form, features = line.rstrip("\n").split("\t")
    assert (lemma, features) == ("abc", "V;PST") and form == charlm.load(tmp_path / "run").rewrite("abc\tV;PST")[0]


def test_a_three_column_file_with_a_missing_or_extra_column_is_refused_naming_the_line(tmp_path):
    rows = ["abc\tV;PST\tabcd", "abc\tabcd", "bad\tN;PL\tbadn", "cab\tV;PRS\tcabs\textra", "dab\t\tdab"]
    data = tmp_path / "bad.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = run_cli(*train_cli(data, tmp_path / "run", steps=2, config=ENCDEC + LAYOUT))
    assert_one_line_error(
        result, 2, "2 without exactly two tabs (source<TAB>features<TAB>target) (lines 2, 4)", "1 with an empty column"
    )
    text = run_cli(*train_cli(data, tmp_path / "r2", steps=2, sets={"data.columns": "source-features-target"}))
    assert_one_line_error(text, 2, "data.columns (source-features-target) is for data.format pairs")


def test_a_resumed_features_run_ends_where_a_straight_one_does(tmp_path):
    data = write_rows(tmp_path / "train.tsv", inflections(200))
    config = [*ENCDEC, *LAYOUT, "--set", "model.dropout=0.1", "--set", "train.eval_interval=2"]
    run_cli(*train_cli(data, tmp_path / "straight", steps=6, config=config), check=True)
    run_cli(*train_cli(data, tmp_path / "resumed", steps=3, config=config), check=True)
    run_cli(*train_cli(out=tmp_path / "resumed", resume=True, steps=6), check=True)
    straight, resumed = (load_checkpoint(tmp_path / name / "last.pt") for name in ("straight", "resumed"))
    assert resumed.tokenizer.features.model_tags() == straight.tokenizer.features.model_tags()
    for name, value in straight.state["model"].items():
        assert value.equal(resumed.state["model"][name]), name


@pytest.mark.process
@skip_without("openai", reason="the server tests use the openai client: pip install -e '.[test]'")
@skip_without("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'")
def test_charlm_serve_rewrites_sources_with_features(features_run):
    import openai
    from serve_helpers import ServerProcess

    run, _, _ = features_run
    prompts = ["abc\tV;PST", "abc\tV;FUT"]  # FUT: a feature the model never saw
    expected = charlm.load(run).rewrite(prompts, unknown="replace")
    server = ServerProcess(run, "--unknown", "replace")
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        completion = client.completions.create(model="charlm", prompt=prompts, temperature=0)
        assert [c.text for c in completion.choices] == expected
        assert completion.usage.unknown_characters == 1
        status, body = server.request("POST", "/v1/completions", {"prompt": "abc", "temperature": 0})
        assert status == 400 and "SOURCE<TAB>FEATURES" in body["error"]["message"]
    finally:
        server.stop()


@skip_without("onnxruntime", reason="ONNX exports need the onnx extra: pip install -e '.[test]'")
@skip_without("onnxscript", reason="torch.onnx's exporter needs onnxscript: pip install -e '.[test]'")
def test_an_onnx_export_reads_features_as_the_checkpoint_does(features_run, tmp_path):
    run, dev, _ = features_run
    run_cli("export", run, tmp_path / "onnx", "--format", "onnx", check=True)
    covered = tmp_path / "covered.tsv"
    covered.write_text("abc\tV;PST\nVead\tN;PL\n", encoding="utf-8")
    for args in (("--prompt-file", covered), ("--prompt-file", covered, "--beam", "3")):
        through = json.loads(run_cli("sample", tmp_path / "onnx", *args, "--json", check=True).stdout)
        assert through["runtime"] == "onnxruntime"
        assert through["targets"] == json.loads(run_cli("sample", run, *args, "--json", check=True).stdout)["targets"]
    scored = [
        json.loads(run_cli("eval", m, "--data", dev, "--json", check=True).stdout) for m in (tmp_path / "onnx", run)
    ]
    assert scored[0]["word_error_rate"] == scored[1]["word_error_rate"]
    assert (scored[0]["unknown_chars"], scored[0]["unknown_features"]) == (2, 1)


def test_best_by_accuracy_keeps_the_evaluation_that_decoded_most_lines_right(tmp_path):
    data = write_rows(tmp_path / "train.tsv", inflections(300))
    sets = {"train.best_by": "accuracy", "train.eval_interval": 5}
    result = run_cli(*train_cli(data, tmp_path / "run", steps=40, config=ENCDEC + LAYOUT, sets=sets, json=True))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "val_accuracy" in r]
    assert len(evaluations) == 8
    best = max(evaluations, key=lambda r: (r["val_accuracy"], -r["step"]))  # the first of the best
    assert load_checkpoint(tmp_path / "run" / "best.pt").step == best["step"]
    assert json.loads(result.stdout.splitlines()[-1])["best_val_accuracy"] == best["val_accuracy"]
    decoder = run_cli(*train_cli(data, tmp_path / "d", steps=2, sets={"train.best_by": "accuracy"}))
    assert_one_line_error(decoder, 2, "train.best_by accuracy decodes the validation lines of pairs")


def test_hallucinated_lines_are_training_lines_with_a_new_stem_and_never_reach_dev_or_test(tmp_path):
    from charlm.config.build import load_config
    from charlm.families.registry import family_for

    train, dev, test = (write_rows(tmp_path / f"{n}.tsv", inflections(k, seed)) for n, k, seed in (("t", 200, 0), ("d", 30, 1), ("e", 30, 2)))  # fmt: skip # noqa: E501
    sets = [f"data.path={train}", f"data.val_path={dev}", f"data.test_path={test}", "data.hallucinate=300"]
    sets += [s for s in ENCDEC[2:] + LAYOUT if s != "--set"]
    config = load_config("tiny", sets)
    family = family_for(config)
    corpus = family.corpus(config, None, lambda _: None, None)
    real = list(corpus.train)
    batches = family.batches(config, corpus, torch.device("cpu"), seed=0)
    made = batches.pairs[len(real) :]
    assert batches.pairs[: len(real)] == real and len(made) == 300
    assert made == family.batches(config, corpus, torch.device("cpu"), seed=5).pairs[len(real) :]  # every rank's
    letters = {corpus.tokenizer.stoi[c] for c in "abcdeV"}
    symbols = {corpus.tokenizer.stoi[chr(0x100000 + i)] for i in range(len(corpus.tokenizer.features.tags))}
    for source, target in made:
        tags = [i for i in source if i in symbols]
        stem = source[: len(source) - len(tags)]
        assert set(stem) <= letters and tags  # characters of the training sources, then the features unchanged
        features = ";".join(corpus.tokenizer.features.name(corpus.tokenizer.chars[i]) for i in tags)
        assert corpus.tokenizer.decode(target) == corpus.tokenizer.decode(stem) + SUFFIX[features]  # the rule kept
    assert sum(pair in real for pair in made) < len(made) // 10  # new stems (a short one may meet a real one)
    held_out = corpus.split("val") + corpus.split("test")
    assert not any(pair in held_out for pair in made)
    plain = family.corpus(load_config("tiny", sets[:3] + sets[4:]), None, lambda _: None, None)
    assert plain.split("val") + plain.split("test") == held_out and plain.train == real


def test_the_features_symbols_follow_their_names_not_the_file_s_order(tmp_path):
    from charlm.config.build import load_config
    from charlm.data.pairs import PairCorpus

    rows = inflections(100)
    tokenizers = []
    for name, ordered in (("a", rows), ("b", rows[::-1])):
        sets = [f"data.path={write_rows(tmp_path / name, ordered)}"] + [s for s in ENCDEC[2:] + LAYOUT if s != "--set"]
        config = load_config("tiny", sets)
        tokenizers.append(PairCorpus.from_config(config.data, 16).tokenizer)
    assert tokenizers[0].chars == tokenizers[1].chars
    assert (
        tokenizers[0].features.model_tags()
        == tokenizers[1].features.model_tags()
        == ["N", "PL", "PRS", "PST", "SG", "V"]
    )


def test_a_resumed_best_by_accuracy_run_keeps_its_best(tmp_path):
    data = write_rows(tmp_path / "train.tsv", inflections(200))
    sets = {"train.best_by": "accuracy", "train.eval_interval": 4}
    first = run_cli(
        *train_cli(data, tmp_path / "run", steps=8, config=ENCDEC + LAYOUT, sets=sets, json=True), check=True
    )
    best = json.loads(first.stdout.splitlines()[-1])["best_val_accuracy"]
    again = run_cli(*train_cli(out=tmp_path / "run", resume=True, steps=16, json=True), check=True)
    summary = json.loads(again.stdout.splitlines()[-1])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["best_val_accuracy"] == max(r["val_accuracy"] for r in records) >= best
