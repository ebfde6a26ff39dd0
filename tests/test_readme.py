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


def test_every_module_named_in_the_code_map_exists():
    import re

    readme = (REPO / "README.md").read_text()
    code_map = readme[readme.index("## Code map") :]
    for path in re.findall(r"`(charlm/[a-z_]+\.py)`", code_map):
        assert (REPO / path).is_file(), path
    listed = set(re.findall(r"`charlm/([a-z_]+\.py)`", code_map))
    modules = {p.name for p in (REPO / "charlm").glob("*.py")} - {"__init__.py", "__main__.py"}
    assert modules <= listed, sorted(modules - listed)
