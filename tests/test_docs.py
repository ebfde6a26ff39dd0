"""The docs cannot drift: blocks of command output they show are what charlm prints today (the cited test names
are checked by tests/test_readme.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# A block of output in the docs is marked `<!-- output-of: charlm info ... -->` on the line above it; the test runs
# that command in-process (with --json) and checks every figure of the block's parameters column.
OUTPUT_OF = re.compile(r"<!-- output-of: charlm (?P<cmd>[^\n]*?) -->\n(?P<block>(?:```.*?```|(?:\|[^\n]*\n)+))", re.S)
FIGURE = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?![\w.])|(?<=[│|] )\s*\d+(?= [│|])")


def marked_outputs() -> list[tuple[str, str, str]]:
    return [
        (doc.relative_to(REPO).as_posix(), m.group("cmd"), m.group("block"))
        for doc in DOCS
        for m in OUTPUT_OF.finditer(doc.read_text(encoding="utf-8"))
    ]


def test_the_docs_mark_their_command_output():
    assert {doc for doc, _, _ in marked_outputs()} >= {"README.md", "docs/concepts.md"}


@pytest.mark.parametrize("doc, cmd, block", marked_outputs(), ids=lambda v: v if "\n" not in v else "")
def test_marked_output_is_what_the_command_prints(doc, cmd, block):
    import json

    from typer.testing import CliRunner

    from charlm.cli.app import app

    result = CliRunner().invoke(app, [*shlex.split(cmd), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    printed = {info["total_params"], info["flops_per_token"]} | {c["params"] for c in info["components"]}
    for stack in {c.get("stack", "layer") for c in info["components"]}:  # an encoder-decoder has two
        per_layer = sum(c["params"] for c in info["components"] if c["per_layer"] and c.get("stack", "layer") == stack)
        printed |= {per_layer * n for n in range(1, 100)}  # the "one layer" and "all L layers" rows
    shown = {int(f.replace(",", "").strip()) for f in FIGURE.findall(block)}
    assert info["total_params"] in shown, f"{doc}: the total shown is not {info['total_params']:,}"
    assert shown <= printed, f"{doc}: {sorted(shown - printed)} are not what `charlm {cmd}` prints"
