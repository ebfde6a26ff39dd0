"""The package's shape: packages by role in layers (a package imports only those below it), no import circle, each
package says its role, storage code does not import the package root, no module grows past 400 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "charlm"

# Bottom to top. A package may import the base modules and any package on a lower line; packages on one line are
# peers and may not import each other. The root (charlm/__init__.py) re-exports the API lazily and is not layered.
BASE = {"errors", "files", "version", "progress"}
LAYERS: list[set[str]] = [
    {"config"},
    {"hardware"},
    {"data"},
    {"models"},
    {"evaluation", "decoding"},
    {"families"},
    {"storage"},
    {"training"},
    {"api"},
    {"serving"},
    {"cli"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The charlm modules a file imports, at the top or inside a function (the deepest module each names)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "charlm":
            for alias in node.names:  # from charlm.pkg import mod: mod is a submodule, or a name of charlm.pkg
                sub = f"{node.module}.{alias.name}"
                is_module = (REPO / Path(*sub.split("."))).with_suffix(".py").exists()
                found.add(sub if is_module or (REPO / Path(*sub.split("."))).is_dir() else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "charlm"}
    return found


def _graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) - {_module_name(p)} for p in root.rglob("*.py")}


def _package(module: str) -> str:
    """charlm.models.decoder -> models; charlm.errors -> errors; charlm -> charlm."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "charlm"


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in sorted(graph.items()):
        source = _package(module)
        if source in ("charlm", "__main__"):  # the root and `python -m charlm` sit above every layer
            continue
        for target in sorted(targets):
            dest = _package(target)
            if dest == source or dest in BASE:
                continue
            if source in BASE:
                wrong.append(f"{module} (a base module) imports {target}")
            elif dest == "charlm" or dest not in LEVEL or LEVEL[dest] >= LEVEL[source]:
                wrong.append(f"{module} ({source}) imports {target} ({dest}), which is not below it")
    return wrong


def test_every_module_sits_in_a_layered_package():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LEVEL), packages ^ set(LEVEL)
    loose = {p.stem for p in PACKAGE.glob("*.py")} - BASE - {"__init__", "__main__"}
    assert not loose, f"modules outside a package: {sorted(loose)}"


def test_each_package_says_its_role_and_what_it_may_import():
    for name in LEVEL:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc.split()) > 20, f"charlm/{name}/__init__.py needs a docstring saying its role"
        assert "import" in doc, f"charlm/{name}/__init__.py's docstring should say what the package may import"


def test_packages_import_only_lower_layers():
    assert layering_violations(_graph()) == []


def test_the_layering_check_catches_an_upward_import(tmp_path):
    """A model module that imports the training package, or a base module that imports a package, is caught."""
    graph = _graph()
    graph["charlm.models.decoder"] = graph["charlm.models.decoder"] | {"charlm.training.loop"}
    graph["charlm.errors"] = {"charlm.config.schema"}
    graph["charlm.evaluation.loss"] = graph["charlm.evaluation.loss"] | {"charlm.decoding.sampling"}
    found = layering_violations(graph)
    assert any(v.startswith("charlm.models.decoder (models) imports charlm.training.loop") for v in found), found
    assert any(v.startswith("charlm.errors (a base module)") for v in found), found
    assert any(v.startswith("charlm.evaluation.loss (evaluation) imports charlm.decoding") for v in found), found


def test_every_package_ships():
    """The wheel lists its packages by name: a new package left out of pyproject.toml would be missing from it."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert {f"charlm.{name}" for name in LEVEL} | {"charlm"} <= listed


def test_no_import_circle_in_the_package():
    graph = _graph()
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                raise AssertionError("import circle: " + " -> ".join(trail[trail.index(target) :] + [target]))
            if target in graph and target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_storage_code_does_not_import_the_package_root():
    graph = _graph()
    for name in ("charlm.storage", "charlm.data", "charlm.config", "charlm.files"):
        for module, targets in graph.items():
            if module == name or module.startswith(name + "."):
                assert "charlm" not in targets, module


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long


# The classes of a model family or of its data: code outside charlm/families/ calls through a family object instead of
# asking which of these it holds.
FAMILY_CLASSES = {"Decoder", "EncoderDecoder", "Encoder", "Corpus", "PairCorpus", "RandomWindows", "PairBatches"}
FAMILY_CLASSES |= {"MaskedWindows", "Model"}


def family_branches(path: Path) -> list[str]:
    """`x.arch == "..."` (or !=, in, not in) and isinstance(x, <family or corpus class>) in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "arch" for s in sides):
                found.append(f"{path.name}:{node.lineno} compares model.arch")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            classes = node.args[1] if len(node.args) > 1 else None
            names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "") for n in ast.walk(classes or node)}
            if names & FAMILY_CLASSES:
                found.append(f"{path.name}:{node.lineno} isinstance(..., {sorted(names & FAMILY_CLASSES)[0]})")
    return found


def test_no_family_branches_outside_the_family_registry():
    outside = [p for p in PACKAGE.rglob("*.py") if "families" not in p.relative_to(PACKAGE).parts]
    assert [b for p in outside for b in family_branches(p)] == []


def test_the_family_branch_check_catches_both_kinds(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        'if config.model.arch == "encoder":\n    pass\nif isinstance(corpus, PairCorpus):\n    pass\n'
        "ok = isinstance(x, tuple)\n"
    )
    assert family_branches(planted) == [
        "planted.py:1 compares model.arch",
        "planted.py:3 isinstance(..., PairCorpus)",
    ]


# Names docs/code-map.md's glossary gives one meaning, and the second names they once had in the code: a banned alias
# may not come back (as a word in code, a module or an import alias).
BANNED_ALIASES = {
    r"\btransducer\b": "the encoder-decoder (rewrites sources)",
    r"\b(stepped_ids|sample_stepped|transduce_stepped|decoding\.stepped)\b": "steps (charlm/decoding/steps.py)",
    r"import (decoder|encoder|encoder_decoder) as (text|pairs|masked)\b": "the family module's own name",
    r"a pairs model": "an encoder-decoder",
    r"a lines decoder": "a lines model",
}


def banned_aliases(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for pattern, name in BANNED_ALIASES.items():
                if re.search(pattern, line, re.IGNORECASE):
                    found.append(f"{path.name}:{number} says {pattern!r}: call it {name}")
    return found


def test_the_glossarys_banned_aliases_stay_out_of_the_code():
    assert banned_aliases(PACKAGE) == []


def test_the_banned_alias_check_catches_one(tmp_path):
    (tmp_path / "planted.py").write_text("from charlm.families import encoder_decoder as pairs\n")
    assert banned_aliases(tmp_path) == [
        "planted.py:1 says 'import (decoder|encoder|encoder_decoder) as (text|pairs|masked)\\\\b': call it the "
        "family module's own name"
    ]
