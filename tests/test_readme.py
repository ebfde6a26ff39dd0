"""README and docs against the code: CI runs the README's test command, every test and module named exists, the
command table lists every command, and the quickstart shows what `charlm train` prints."""

import re

import pytest
from conftest import REPO


def test_ci_runs_the_test_command_written_in_the_readme():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = 'pip install -e ".[test]" && python -m pytest'
    assert command in readme
    assert command in ci.splitlines()


def test_every_test_named_in_the_readme_and_docs_exists():
    """A test cited as evidence must exist: a renamed or deleted test fails here, not in a reader's hands."""
    import re

    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    cited: dict[str, set[str]] = {}
    for path in files:
        text = path.read_text()
        # test_x (a test) but not tests/test_x.py (a file) nor data.test_size (a config key)
        for name in re.findall(r"(?<![.\w/])(test_[a-z0-9_]+)\b(?!\.py)", text):
            cited.setdefault(name, set()).add(path.name)
    stems = {p.stem for p in (REPO / "tests").glob("test_*.py")}
    defined = set(
        re.findall(r"^\s*def (test_[a-z0-9_]+)", "\n".join(p.read_text() for p in (REPO / "tests").glob("*.py")), re.M)
    )
    missing = {name: sorted(where) for name, where in cited.items() if name not in defined | stems}
    assert len(cited) > 20 and not missing, missing


def test_the_code_map_names_every_module_of_every_package():
    """docs/code-map.md (linked from the README) names every module of every package, charlm/**/*.py but
    __init__.py and __main__.py, gives each package its section, and names no module that does not exist."""
    import re

    assert "docs/code-map.md" in (REPO / "README.md").read_text()
    code_map = (REPO / "docs" / "code-map.md").read_text()
    named = set(re.findall(r"`(charlm/[a-z_/]+\.py)`", code_map))
    assert not {path for path in named if not (REPO / path).is_file()}, "named but missing"
    modules = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "charlm").rglob("*.py")
        if p.name not in {"__init__.py", "__main__.py"}
    }
    assert modules <= named, sorted(modules - named)
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "charlm").glob("*/__init__.py")}
    sections = set(re.findall(r"^## (charlm/[a-z_]+)\b", code_map, re.M))
    assert packages <= sections, sorted(packages - sections)


def test_the_readme_lists_every_command():
    """The README's command table names every command `charlm --help` lists, and no other."""
    import re

    from typer.main import get_command

    from charlm.cli.app import app

    commands = set(get_command(app).commands)  # a click Group: the registered commands by name
    listed = set(re.findall(r"^\| `charlm ([a-z]+)\b", (REPO / "README.md").read_text(), re.M))
    assert len(commands) > 10 and listed == commands, (sorted(commands - listed), sorted(listed - commands))


def test_the_readme_is_a_short_read_in_the_projects_width():
    """A newcomer's page: at most 250 lines, none wider than the project's 120 columns (tables included)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    wide = [f"README.md:{number}: {len(line)} columns" for number, line in enumerate(lines, 1) if len(line) > 120]
    assert len(lines) <= 250 and not wide, (len(lines), wide)


# The README's quickstart shows what a first `charlm train` prints, in a block marked `<!-- train-output ... -->`.
TRAIN_BLOCK = re.compile(r"<!-- train-output[^\n]*-->\n```text\n(?P<body>.*?)```", re.S)
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


# The budget rule's first line says how its speed was had: measured (with the machine's setting) or given.
SPEED_SOURCE = re.compile(r"(chars/s for the \d+ x \d+ reference here) \([^)]*\)")


def masked(line: str) -> str:
    """A printed line with its figures as N, its runs of spaces as one (column widths follow the figures) and the
    speed's source as (...)."""
    return " ".join(NUMBER.sub("N", SPEED_SOURCE.sub(r"\1 (...)", line)).split())


# Header lines that say what this CPU does (bfloat16 where it pays, oneDNN's kernels on AMD's): they differ by CPU kind.
CPU_LINES = ("precision:", "linear layers:")


def machine_free(header: list[str]) -> list[str]:
    """The header's lines less those that depend on the CPU (each with the lines that wrap it: they start with
    spaces)."""
    kept, dropping = [], False
    for line in header:
        dropping = line.startswith(CPU_LINES) or (dropping and line.startswith(" "))
        if not dropping:
            kept.append(line)
    return kept


def train_output_parts(lines: list[str]) -> dict[str, list[str]]:
    """What `charlm train` prints, in its parts, figures masked: the header (its lines as one text, so that the
    README may wrap a line wider than its 120 columns; the lines that depend on the CPU left out), the evaluation
    table's heading, its rows (the mark of an improvement left out; `...` where the README abridges) and the summary
    (from `done (...)` on, as one text). Parts that are not there are empty."""
    lines = [line for line in lines if line.strip()]
    heading = next((i for i, line in enumerate(lines) if line.split()[:3] == ["step", "train", "val"]), len(lines))
    done = next((i for i, line in enumerate(lines) if line.startswith("done (")), len(lines))
    return {
        "header": [masked(" ".join(machine_free(lines[:heading])))],
        "table": [masked(line) for line in lines[heading : heading + 1]],
        "rows": [masked(line.removesuffix(" *").rstrip()) for line in lines[heading + 1 : done]],
        "summary": [masked(" ".join(lines[done:]))],
    }


def train_output_problems(shown: list[str], printed: list[str]) -> list[str]:
    """How the README's block (`shown`, its lines after the command) differs from what `charlm train` printed, figures
    aside: its header lines, table heading and summary must be the printed ones, in order, word for word (a line
    may be wrapped); each of its rows must have a printed row's form."""
    readme, run = train_output_parts(shown), train_output_parts(printed)
    problems = [
        f"{part}: the README shows {readme[part]}, charlm train prints {run[part]}"
        for part in ("header", "table", "summary")
        if readme[part] != run[part] or not any(run[part])
    ]
    rows = [row for row in readme["rows"] if row != "..."]
    if not rows or not set(rows) <= set(run["rows"]):
        problems.append(f"rows: the README shows {readme['rows']}, charlm train prints {run['rows']}")
    return problems


def readme_train_block() -> list[str]:
    block = TRAIN_BLOCK.search((REPO / "README.md").read_text(encoding="utf-8"))
    assert block, "README.md has no `<!-- train-output -->` block"
    command, *shown = block.group("body").splitlines()
    assert command == "$ charlm train"
    return shown


def test_the_readme_shows_what_a_first_train_prints(tmp_path, corpus, monkeypatch):
    """The quickstart's output block is what `charlm train` prints today, figures aside: the budget rule's lines for
    plain `charlm train` (its 100 s, at the speed tests/conftest.py gives) on a file of tiny-shakespeare's size, then
    one second of the recipe they pick, configs/cpu.yaml's. The header's lines that say what this CPU does
    (precision, linear kernels) differ by CPU kind and are compared by being there, not word for word."""
    from conftest import run_cli

    from charlm.training.run import resolve_run

    (tmp_path / "data").mkdir()
    excerpt = corpus.read_bytes()
    size = 1_115_394  # the whole corpus's: the rule's regularisation follows the training split's size
    (tmp_path / "data" / "tinyshakespeare.txt").write_bytes((excerpt * (size // len(excerpt) + 1))[:size])
    monkeypatch.chdir(tmp_path)
    request, budget_lines = resolve_run(None, [], {}, None), []
    assert request.budget is not None and request.out_dir.as_posix() == "runs/cpu"
    request.budget.config(budget_lines.append)
    result = run_cli("train", "--out-dir", "runs/cpu", "--max-seconds", "1", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = [*budget_lines, *(result.stderr + result.stdout).splitlines()]
    problems = train_output_problems(readme_train_block(), printed)
    assert not problems, problems
    assert [line for line in readme_train_block() if line.startswith(CPU_LINES)], "the block shows no precision line"


@pytest.mark.parametrize(
    "old, new",
    [
        ("lr schedule:", "learning rate:"),  # a header line reworded
        ("linear layers:", "matrix products:"),  # a line of the CPU's, no longer one
        ("    step    train", "    iter    train"),  # the table's heading
        ("done (", "finished ("),  # the summary reworded
        ("best val loss", "lowest val loss"),
        ("checkpoints in", "saved in"),
    ],
)
def test_the_train_output_check_catches_a_reworded_line(old, new):
    shown = readme_train_block()
    reworded = [line.replace(old, new) for line in shown]
    assert reworded != shown, f"{old!r} is not in the README's block"
    assert train_output_problems(shown, shown) == []
    assert train_output_problems(shown, reworded)
    assert train_output_problems(reworded, shown)
    without_schedule = [line for line in shown if not line.startswith(("lr schedule:", "  train.lr_schedule"))]
    assert train_output_problems(shown, without_schedule)  # a header line no longer printed
