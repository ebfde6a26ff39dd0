from conftest import REPO


def test_ci_runs_the_test_command_written_in_the_readme():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = 'pip install -e ".[test]" && python -m pytest'
    assert command in readme
    assert command in ci.splitlines()


def test_every_test_named_in_the_concepts_guide_exists():
    import re

    text = (REPO / "docs" / "concepts.md").read_text()
    names = set(re.findall(r"\btest_[a-z0-9_]+\b(?!\.py)", text)) - set(re.findall(r"\b(test_[a-z0-9_]+)\.py", text))
    defined = set(re.findall(r"^def (test_[a-z0-9_]+)", "\n".join(p.read_text() for p in (REPO / "tests").glob("*.py")),
                             re.M))
    assert len(names) > 20 and names <= defined, sorted(names - defined)


def test_every_module_named_in_the_code_map_exists():
    import re

    readme = (REPO / "README.md").read_text()
    code_map = readme[readme.index("## Code map"):]
    for path in re.findall(r"`(charlm/[a-z_]+\.py)`", code_map):
        assert (REPO / path).is_file(), path
    listed = set(re.findall(r"`charlm/([a-z_]+\.py)`", code_map))
    modules = {p.name for p in (REPO / "charlm").glob("*.py")} - {"__init__.py", "__main__.py"}
    assert modules <= listed, sorted(modules - listed)
