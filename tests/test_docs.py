"""The docs cannot drift: blocks of command output they show are what charlm prints today, and every link leads to
a file and heading that exist (the cited test names are checked by tests/test_readme.py)."""

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
    assert {doc for doc, _, _ in marked_outputs()} >= {"docs/inspecting.md", "docs/concepts.md"}


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


def block_rows(block: str) -> list[tuple[str, str]]:
    """(label, parameters) of each row of a marked table: a rich box (`│ label │ 1,234 │ formula │`) or Markdown
    (`| label | 1,234 | formula |`), header and rule rows left out, Markdown bold removed."""
    rows = []
    for line in block.splitlines():
        sep = "│" if line.startswith("│") else "|" if line.startswith("|") else None
        if sep is None:
            continue
        cells = [c.strip().replace("**", "") for c in line.strip().strip(sep).split(sep)]
        if len(cells) < 2 or cells[0] == "component" or set(cells[0]) <= set("-: "):
            continue
        rows.append((cells[0], cells[1]))
    return rows


def printed_rows(info: dict) -> dict[str, int]:
    """Every row label `charlm info` prints for this --json answer, with its parameters (charlm/cli/report.py)."""
    names = {"layer": "layer", "encoder": "encoder layer", "decoder": "decoder layer"}
    rows = {}
    for c in info["components"]:
        label = f"per {names[c.get('stack', 'layer')]}: {c['component']}" if c["per_layer"] else c["component"]
        rows[label] = c["params"]
    for stack, name in names.items():
        per_layer = sum(c["params"] for c in info["components"] if c["per_layer"] and c.get("stack", "layer") == stack)
        if per_layer and stack != "layer":
            rows[f"one {name}"] = per_layer
    rows["total"] = info["total_params"]
    rows["training FLOPs per token"] = info["flops_per_token"]
    if info["active_params"] != info["total_params"]:
        rows["active per token"] = info["active_params"]
    return rows


def label_problems(block: str, info: dict) -> list[str]:
    """The rows of a marked block whose label `charlm info` does not print, or prints beside another figure."""
    printed = printed_rows(info)
    per_layer = {
        stack: sum(c["params"] for c in info["components"] if c["per_layer"] and c.get("stack", "layer") == stack)
        for stack in ("layer", "encoder", "decoder")
    }
    problems = []
    for label, figure in block_rows(block):
        shown = int(figure.replace(",", "")) if re.fullmatch(r"[\d,]+", figure) else None
        if m := re.fullmatch(r"all (\d+) (encoder |decoder )?layers", label):
            expected = per_layer[(m.group(2) or "layer ").strip()] * int(m.group(1))
        elif label in printed:
            expected = printed[label]
        else:
            problems.append(f"{label!r} is not a row `charlm info` prints (it prints {sorted(printed)})")
            continue
        if shown != expected:
            problems.append(f"{label!r} shows {figure}, the command prints {expected:,}")
    return problems


@pytest.mark.parametrize("doc, cmd, block", marked_outputs(), ids=lambda v: v if "\n" not in v else "")
def test_marked_output_labels_are_what_the_command_prints(doc, cmd, block):
    """Not only the figures: each row's label is one the command prints, beside the figure it prints for it."""
    import json

    from typer.testing import CliRunner

    from charlm.cli.app import app

    result = CliRunner().invoke(app, [*shlex.split(cmd), "--json"])
    assert result.exit_code == 0, result.output
    assert len(block_rows(block)) >= 5, f"{doc}: no table rows found under `charlm {cmd}`"
    problems = label_problems(block, json.loads(result.stdout))
    assert not problems, f"{doc}: {problems}"


def test_the_label_check_catches_a_renamed_row():
    info = {
        "total_params": 30,
        "active_params": 30,
        "flops_per_token": 99,
        "components": [
            {"component": "token embedding", "params": 10, "per_layer": False, "stack": "layer"},
            {"component": "norms (layernorm, pre)", "params": 10, "per_layer": True, "stack": "layer"},
        ],
    }
    good = "| token embedding | 10 | V·d |\n| per layer: norms (layernorm, pre) | 10 | 2·d |\n| all 2 layers | 20 | |\n"
    assert label_problems(good + "| **total** | **30** | |\n", info) == []
    assert label_problems("| per layer: two LayerNorms | 10 | 2·d |\n", info)  # a label the command never prints
    assert label_problems("| token embedding | 12 | V·d |\n", info)  # a printed label beside another figure


# The docs speak of the project alone: no issue numbers, no account of who worked on it or measured what when, no
# folders only the authors had, and every command runs from a clone.
HISTORY = [
    (re.compile(r"\bissue #?\d+", re.I), "an issue number"),
    (re.compile(r"\b(the|this|that) issue\b", re.I), "an issue of the tracker"),
    (re.compile(r"(?<![\w&/])#\d{2,}\b"), "an issue or pull-request number"),
    (re.compile(r"\.\./shared\b"), "a path outside the clone"),
    (re.compile(r"(?<![\w.~-])/(work|root|tmp|home)/"), "an absolute path of one machine"),
    (re.compile(r"\bruns/cpu_(new|before)\b"), "a run folder the reader does not have"),
    (re.compile(r"developers'? guide", re.I), "a guide outside the project"),
    (re.compile(r"kept outside this repository", re.I), "something outside the project"),
    (re.compile(r"\bno GPU (has been|was|is) lent\b", re.I), "how the work was done"),
    (re.compile(r"\bdeveloped on\b", re.I), "the machines of the work"),
    (re.compile(r"\b(this|the previous|that|the same|the last) session\b", re.I), "a working session"),
    (re.compile(r"\bsession's\b", re.I), "a working session"),
    (re.compile(r"\bwe (measured|found|tried|ran)\b", re.I), "who measured it"),
]


def history_problems(text: str) -> list[str]:
    """What in a doc speaks of the work rather than of the project: each as `line N: what ('match')`."""
    return [
        f"line {n}: {what} ({m.group(0)!r})"
        for n, line in enumerate(text.splitlines(), 1)
        for pattern, what in HISTORY
        if (m := pattern.search(line))
    ]


def project_docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "configs").glob("*.yaml"))]


def test_the_docs_speak_of_the_project_alone():
    problems = {
        p.relative_to(REPO).as_posix(): found for p in project_docs() if (found := history_problems(p.read_text()))
    }
    assert len(project_docs()) > 15 and not problems, problems


@pytest.mark.parametrize(
    "planted",
    [
        "As issue 12 asks, the loss is below 1.5.",
        "See #123 for the discussion.",
        "charlm train --data ../shared/data/x.txt",
        "python scripts/bench_sample.py --model runs/cpu_new",
        "Figures quoted in the developers' guide (kept outside this repository).",
        "No GPU has been lent to this project yet.",
        "The machines charlm is developed on cannot reach it.",
        "We measured it again in this session.",
        "charlm train --data /work/main/data/x.txt",
    ],
)
def test_the_history_check_catches_planted_words(planted):
    clean = "charlm train --data data/tinyshakespeare.txt  # 1.4948 nats/char, 2026-11-23, AMD EPYC, torch 2.13.0+cpu\n"
    assert history_problems(clean) == []
    assert history_problems(clean + planted)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens, a
    repeated heading numbered (-1, -2, ...); headings inside fenced code are not headings."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not (m := re.match(r"#{1,6} +(.*?) *#* *$", line)):
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_links(doc: Path) -> list[str]:
    """Each relative link of a doc (outside fenced code) whose file is missing or whose #anchor no heading has."""
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_link_in_the_docs_resolves():
    """The README's and docs' links lead somewhere: the file exists and the #anchor is one of its headings."""
    broken = {doc.relative_to(REPO).as_posix(): found for doc in DOCS if (found := broken_links(doc))}
    assert not broken, broken


def test_the_link_check_catches_a_wrong_anchor(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# A\n\n## Today's figures: 100 s\n\n## Today's figures: 100 s\n\n```\n## not a heading\n```\n")
    assert heading_anchors(doc.read_text()) == {"a", "todays-figures-100-s", "todays-figures-100-s-1"}
    doc.write_text(doc.read_text() + "[ok](#todays-figures-100-s-1) [ok](a.md#a) [web](https://example.com/#x)\n")
    assert broken_links(doc) == []
    doc.write_text(doc.read_text() + "[bad](#not-a-heading) [gone](missing.md)\n")
    assert broken_links(doc) == ["#not-a-heading: no such heading", "missing.md: no such file"]
