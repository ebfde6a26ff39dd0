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
