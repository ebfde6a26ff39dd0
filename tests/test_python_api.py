"""The Python API: docs/python-api.md's examples run as written; errors are the CLI's; no process-wide effects."""

import os
import re
import shutil
import signal

import pytest
from conftest import REPO

import charlm


def _examples() -> list[str]:
    text = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_documented_examples_run_in_order(tmp_path, corpus, capsys):
    (tmp_path / "data").mkdir()
    shutil.copy(corpus, tmp_path / "data" / "tinyshakespeare.txt")
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        namespace: dict = {}
        examples = _examples()
        assert len(examples) >= 5
        for code in examples:
            exec(compile(code, "docs/python-api.md", "exec"), namespace)
    finally:
        os.chdir(here)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    out = capsys.readouterr().out
    assert "nats/char" in out and "checkpoint not found" in out


def test_load_generate_matches_the_command_line(tiny_checkpoint):
    from conftest import run_cli

    model = charlm.load(tiny_checkpoint)
    text = model.generate("JULIET:", max_new_tokens=60, seed=1)
    cli = run_cli("sample", tiny_checkpoint, "--prompt", "JULIET:", "--max-new-tokens", "60", "--seed", "1", check=True)
    assert text.startswith("JULIET:") and cli.stdout == text + "\n"


def test_a_limit_far_beyond_the_text_decoded_costs_only_what_is_decoded(tiny_checkpoint):
    """The buffer of ids grows with the text (doubling past its first 4,096 places), so that a limit meant as "until
    the stop string" needs no memory for the characters never decoded."""
    model = charlm.load(tiny_checkpoint)
    short = model.generate("a", max_new_tokens=100, temperature=0)
    long = model.generate("a", max_new_tokens=4200, temperature=0)  # past the first buffer
    assert len(long) == 4201 and long.startswith(short)
    stopped = model.generate("a", max_new_tokens=10**12, stop=[" "], seed=1)
    assert stopped.startswith("a") and len(stopped) < 1000 and " " not in stopped


def test_evaluate_matches_charlm_eval(tiny_checkpoint):
    import json

    from conftest import run_cli

    ours = charlm.load(tiny_checkpoint).evaluate()
    cli = json.loads(run_cli("eval", tiny_checkpoint, "--json", check=True).stdout)
    assert {**ours.to_dict(), "runtime": "torch"} == cli  # --json also says which runtime computed it


def test_errors_are_the_cli_errors_and_importable_from_charlm(tiny_checkpoint):
    model = charlm.load(tiny_checkpoint)
    with pytest.raises(charlm.UsageError, match="U\\+00E9"):
        model.generate("café")
    with pytest.raises(charlm.UsageError, match="top_p must be between 0 and 1"):  # named as the argument is
        model.generate("a", top_p=1.5)
    with pytest.raises(charlm.UsageError, match="temperature must be >= 0"):
        model.generate("a", temperature=float("nan"))
    with pytest.raises(charlm.UsageError, match=r"seed must be between -2\*\*63 and 2\*\*63 - 1"):
        model.generate("a", seed=2**70)
    wrong_types = [({"max_new_tokens": 2.5}, "max_new_tokens must be a whole number"), ({"seed": "x"}, "seed must")]
    wrong_types += [({"top_k": True}, "top_k must be a whole number"), ({"temperature": "hot"}, "must be a number")]
    for options, needle in wrong_types:
        with pytest.raises(charlm.UsageError, match=needle):
            model.generate("a", **options)
    with pytest.raises(charlm.UsageError, match="the prompt must be a string, got 5"):
        model.generate(5)
    np = pytest.importorskip("numpy")  # a notebook's numbers: numpy's are numbers too
    assert model.generate("a", max_new_tokens=np.int64(5), temperature=np.float32(0.5), seed=np.int64(3)) == (
        model.generate("a", max_new_tokens=5, temperature=0.5, seed=3)
    )
    with pytest.raises(charlm.UsageError, match="fewer than 2"):  # the empty text, not the current folder
        model.evaluate("")
    for path in (None, ""):
        with pytest.raises(charlm.UsageError, match="path must name a checkpoint"):
            charlm.load(path)
    mistakes = [({"budget": 60}, "budget must be a duration string"), ({"overrides": [("a", 1)]}, "overrides must")]
    mistakes += [({"out_dir": 5}, "out_dir must be a folder's path")]
    mistakes += [({"resume": True, "overwrite": True}, "contradict")]
    for arguments, needle in mistakes:
        with pytest.raises(charlm.UsageError, match=needle):
            charlm.train("tiny", **arguments)
    assert model.generate("a", top_p=0, max_new_tokens=5, seed=1) == model.generate(
        "a", temperature=0, max_new_tokens=5
    )
    assert issubclass(charlm.UsageError, charlm.CharlmError) and issubclass(charlm.WorkError, charlm.CharlmError)


def test_info_counts_the_modules_parameters(tiny_checkpoint):
    model = charlm.load(tiny_checkpoint)
    assert model.info().total_params == sum(p.numel() for p in model.module.parameters())


# -- export ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tiny_checkpoint, tmp_path_factory):
    pytest.importorskip("safetensors", reason="exports need the safetensors package (the test extra has it)")
    from conftest import run_cli

    out = tmp_path_factory.mktemp("export") / "exp"
    result = run_cli("export", tiny_checkpoint, out, check=True)
    assert "exported" in result.stderr
    return out


def test_an_export_holds_weights_config_vocabulary_and_a_card(exported, tiny_checkpoint):
    import json

    import safetensors.torch
    import torch

    assert sorted(p.name for p in exported.iterdir()) == ["README.md", "config.json", "model.safetensors", "vocab.json"]
    weights = safetensors.torch.load_file(str(exported / "model.safetensors"))
    saved = torch.load(tiny_checkpoint, weights_only=True)["model"]
    assert weights.keys() == saved.keys() and all(torch.equal(weights[k], saved[k]) for k in saved)
    assert json.loads((exported / "config.json").read_text())["model"]["n_embd"] == 32
    card = (exported / "README.md").read_text()
    assert "nats/char" in card and "bits/char" in card and f'charlm.load("{exported}")' in card
    table = card.split("\n\n")[2].splitlines()  # the card's table: every row whole on its line, or Markdown ends it
    assert all(row.startswith("|") and row.endswith("|") for row in table), table
    assert any(row.startswith("| parts | ") and row.endswith(" head |") for row in table)


def test_an_export_gives_bit_identical_logits_and_the_same_samples(exported, tiny_checkpoint, corpus):
    import torch
    from conftest import run_cli

    a, b = charlm.load(tiny_checkpoint, device="cpu"), charlm.load(exported, device="cpu")
    ids = torch.tensor([a.tokenizer.encode("JULIET: O Romeo!")])  # 16 characters: the context
    assert torch.equal(a.module(ids)[0], b.module(ids)[0])
    args = ("--prompt", "JULIET:", "--seed", "1", "--max-new-tokens", "80")
    assert (
        run_cli("sample", exported, *args, check=True).stdout
        == run_cli("sample", tiny_checkpoint, *args, check=True).stdout
    )
    # an export records its corpus by file name only (never a path of the trainer's disk): eval is told where it is
    for command, extra in (("eval", ("--data", str(corpus), "--split", "val")), ("info", ())):
        assert (
            run_cli(command, exported, "--json", *extra, check=True).stdout
            == run_cli(command, tiny_checkpoint, "--json", *extra, check=True).stdout
        )


def test_a_tampered_export_config_is_one_line(exported, tmp_path):
    import json

    from conftest import assert_one_line_error, run_cli

    bad = tmp_path / "bad"
    shutil.copytree(exported, bad)
    config = json.loads((bad / "config.json").read_text())
    config["model"]["n_embd"] = 48
    (bad / "config.json").write_text(json.dumps(config))
    assert_one_line_error(run_cli("sample", bad), 2, "does not match its recorded model shape")
    with pytest.raises(charlm.UsageError, match="does not match"):
        charlm.load(bad)


def test_an_export_records_the_data_file_name_not_its_path_and_names_the_optimizer(tmp_path, tiny_checkpoint):
    import json

    from charlm import export

    export(tiny_checkpoint, tmp_path / "exported")
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    card = (tmp_path / "exported" / "README.md").read_text()
    assert config["data"]["path"] == "tinyshakespeare-excerpt.txt"  # trained on an absolute path under tests/data
    assert str(REPO) not in card and str(REPO) not in json.dumps(config)
    assert "AdamW lr" in card and "Muon" not in card
