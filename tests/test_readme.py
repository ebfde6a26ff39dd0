from conftest import REPO


def test_ci_runs_the_test_command_written_in_the_readme():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = 'pip install -e ".[test]" && python -m pytest'
    assert command in readme
    assert command in ci.splitlines()
