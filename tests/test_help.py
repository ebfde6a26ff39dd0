"""Every `--help` as a user sees it: flags show no value placeholder, each command's summary is one unbroken
sentence in `charlm --help`, and the option lists are built from what ships (the config names)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from charlm.cli.app import app
from charlm.config.sources import shipped_config_names

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def rendered_help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_listed_with_a_one_line_summary():
    command = typer.main.get_command(app)
    shown = rendered_help()
    for name in COMMANDS:
        assert re.search(rf"│ {name}\s", shown), f"{name} missing from charlm --help"
        summary = (command.commands[name].help or "").split("\n\n")[0]  # type: ignore[attr-defined]
        assert summary and "\n" not in summary.strip(), f"{name}'s summary breaks mid-sentence: {summary!r}"


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_flags_show_no_value_placeholder(name):
    """A flag takes no value, so its help line must not read like `--json <bool>`; options with values keep theirs."""
    command = typer.main.get_command(app)
    target = command.commands[name] if name else command  # type: ignore[attr-defined]
    text = rendered_help(*([name] if name else []))
    assert "<bool>" not in text
    flags = [opt for p in target.params if getattr(p, "is_flag", False) for opt in p.opts if opt.startswith("--")]
    for flag in flags:
        line = next(ln for ln in text.splitlines() if re.search(rf"{re.escape(flag)}(\s|,|$)", ln))
        assert not re.search(rf"{re.escape(flag)}\s+(-\w\s+)?<", line), line


def test_config_help_names_every_shipped_config():
    text = " ".join(rendered_help("train").split())
    names = shipped_config_names()
    assert len(names) >= 10
    for name in names:
        assert re.search(rf"[(, ]{re.escape(name)}[,)]", text), f"--config help leaves out {name}"


def test_checkpoint_arguments_say_an_export_is_accepted():
    for name in ("info", "export", "sample", "eval"):
        assert "or export" in " ".join(rendered_help(name).split()), name


def test_eval_json_help_names_each_kind_of_results_figures():
    """Every figure `charlm eval --json` prints for a text, a list of pairs, a lines model or an encoder is named in
    its help (the per-item details of pairs and lists, and the skipped lines, are left to the docs)."""
    from charlm.evaluation.items import ItemsResult
    from charlm.evaluation.loss import EvalResult
    from charlm.evaluation.masked import MaskedResult
    from charlm.evaluation.transduction import TransductionResult

    details = {
        "sources",
        "unknown_chars",
        "unknown_lines",
        "unknown_target_lines",
        "unknown_features",
        "single_reference",
        "skipped",
        "scores",
    }
    results = [
        EvalResult(loss=1.0, chars=1),
        TransductionResult(1.0, 1.0, word_error_rate=0, char_error_rate=0, token_error_rate=0, lines=1, chars=1),
        ItemsResult(loss=1.0, chars=1, items=1),
        MaskedResult(loss=1.0, accuracy=1.0, chars=1),
    ]
    text = " ".join(rendered_help("eval").split())
    for result in results:
        for key in [*(result.to_dict().keys() - details), "runtime"]:
            assert re.search(rf"\b{key}\b", text), f"eval --json help leaves out {type(result).__name__}.{key}"
