"""The README.md model card of an export, laid out in Markdown from what the model's family says of it (CardFacts)."""

from __future__ import annotations

import json
from pathlib import Path

from charlm.errors import shell_path
from charlm.families.base import DATA, FOLDER, CardFacts


def model_card(facts: CardFacts, folder: Path, files: str) -> str:
    """The card: a heading and what the model is, a table of its shape and validation figures, how to use it from
    the shell and from Python, the files beside it (`files`: what the export format writes), and the family's
    example of its output where it gives one."""
    data = f"`{facts.data}`"
    rows = [*facts.rows, ("quality", quality(facts).replace(DATA, data))]
    lines = [f"# charlm {facts.title}", "", facts.summary.replace(DATA, data), "", "| | |", "|---|---|"]
    lines += [f"| {what} | {value} |" for what, value in rows]
    lines.append("")
    if facts.inline_example:
        prompt, verb, output = facts.inline_example
        lines += [f"`{prompt}` {verb} `{output}`.", ""]
    commands = [command.replace(FOLDER, shell_path(folder)) for command in facts.commands]
    python = [line.replace(FOLDER, python_path(folder)) for line in facts.python]
    lines += ["## Use it", "", "```bash", *commands, "```", "", "```python", "import charlm", *python, "```", ""]
    lines += [files, ""]
    if facts.example_heading:
        lines += [f"## {facts.example_heading}", "", "```text", facts.example, "```", ""]
    return "\n".join(lines)


def quality(facts: CardFacts) -> str:
    """The table's quality row: the validation figures, the headline in bold, or why there are none."""
    if facts.quality is None:
        return f"not measured here: {facts.data_missing} not found at export time"
    lead, figure, rest = facts.quality
    return f"{lead}**{figure}**{rest}"


def python_path(path: Path | str) -> str:
    """A path as a Python string literal in a model card (JSON's escapes are Python's)."""
    return json.dumps(str(path), ensure_ascii=False)
