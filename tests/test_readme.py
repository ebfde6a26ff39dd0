"""README and docs against the code: CI runs the README's test command, every test and module named exists, and the
command table lists every command."""

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
