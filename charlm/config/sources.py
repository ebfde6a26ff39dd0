"""Config files and overrides: finding a shipped config by name, reading YAML safely, following a file's `base:`
chain, parsing `--set key=value`.

Nothing here knows the keys (file_settings is handed the sections' names): charlm/config/build.py applies and
validates what these functions read.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from charlm.errors import UsageError

# Where the shipped configs live: `configs/` beside the package in a source checkout, or the
# copy that the wheel installs as `charlm/_configs`.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # charlm/, above charlm/config/
CONFIG_DIRS = (_PACKAGE_DIR.parent / "configs", _PACKAGE_DIR / "_configs")


# ---------------------------------------------------------------------------- finding and reading


# A config file's one top-level key that is not a section: the config it builds on. `base: defaults` builds on the
# schema's own defaults (what every key means when nothing sets it); a file without `base:` builds on the default
# recipe (schema.DEFAULT_CONFIG), so that a user's two-key file changes two keys of what `charlm train` runs.
BASE_KEY = "base"
SCHEMA_DEFAULTS = "defaults"


def find_config(name_or_path: str) -> Path:
    """A file as given, the name of a shipped config ("cpu", "tiny.yaml"), or a run folder (its config.yaml). A bare
    name is a shipped config's unless a file of that name is here: a run folder called `cpu` (runs/cpu, seen from
    runs/) never stands in for configs/cpu.yaml."""
    path = Path(name_or_path)
    stem = path.name[:-5] if path.name.endswith(".yaml") else path.name
    if path.parent == Path(".") and not path.is_file():  # a bare name: the shipped configs first
        for folder in CONFIG_DIRS:
            candidate = folder / f"{stem}.yaml"
            if candidate.is_file():
                return candidate
    if path.is_dir() and (path / "config.yaml").is_file():
        return path / "config.yaml"
    if path.exists():
        return path
    shipped = ", ".join(shipped_config_names()) or "none found"
    raise UsageError(f"config file not found: {name_or_path} (shipped configs: {shipped})")


def shipped_config_names() -> list[str]:
    for folder in CONFIG_DIRS:
        if folder.is_dir():
            return sorted(p.stem for p in folder.glob("*.yaml"))
    return []


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader (tags that build objects refused), refusing a key given twice in one mapping, where
    YAML's own rule keeps the last silently (a second `train:` section would drop the first one's settings)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys the mapping's own may override
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the parent names it in its own words
                break
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice (the second would silently replace the first)",
                    key_node.start_mark,
                )  # fmt: skip
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """YAML text as data: safe (nothing executed), and every key of a mapping given once."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def shown_path(path: Path) -> str:
    """How messages name a config file: a shipped one as configs/NAME.yaml, another as given."""
    if any(path.resolve().parent == folder.resolve() for folder in CONFIG_DIRS):
        return f"configs/{path.name}"
    return str(path)


def is_pickle(head: bytes) -> bool:
    """A checkpoint (torch's zip archive) or a bare pickle (protocol 2-5): never read as a config."""
    return head.startswith(b"PK\x03\x04") or (len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5)


def read_yaml_file(path: Path) -> dict[str, Any]:
    """Parse a config file with load_yaml (never executed); it must hold a mapping."""
    if path.is_dir():
        raise UsageError(f"config path is a directory, not a YAML file: {path}")
    try:
        data = path.read_bytes()
        if is_pickle(data[:4]):
            raise UsageError(
                f"{path} is a checkpoint or pickle, not a YAML config (configs are read as YAML only, never "
                "unpickled): name the run's config.yaml, or its run folder"
            )
        raw = load_yaml(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"config file {path} is not UTF-8 text (bad byte at offset {e.start})") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"config file {path} is not valid YAML{where}: {problem}") from e
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from e
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"config file {path} must hold a mapping of sections (data, model, train, sample)")
    return raw


@dataclass
class ConfigFile:
    """One file of a config's chain: its sections (the `base:` key taken out) and how messages name it."""

    path: Path
    sections: dict[str, Any]
    shown: str


def config_chain(name_or_path: str, default_recipe: str) -> list[ConfigFile]:
    """The config a user names and every config it builds on, the root first: the settings of each later file
    change those of the earlier ones. A file without `base:` builds on `default_recipe` (unless it is that file)."""
    chain: list[ConfigFile] = []
    path, recipe = find_config(name_or_path), find_config(default_recipe).resolve()
    while True:
        if path.resolve() in [f.path.resolve() for f in chain]:
            loop = " -> ".join([*(f.shown for f in reversed(chain)), shown_path(path)])
            raise UsageError(f"config files build on each other in a cycle: {loop}; remove one of their `base:` keys")
        sections = read_yaml_file(path)
        base = sections.pop(BASE_KEY, SCHEMA_DEFAULTS if path.resolve() == recipe else default_recipe)
        chain.insert(0, ConfigFile(path, sections, shown_path(path)))
        if base == SCHEMA_DEFAULTS:
            return chain
        path = find_base(base, path)


def chain_settings(
    name_or_path: str, default_recipe: str, sections: Mapping[str, list[str]]
) -> tuple[list[Setting], list[str]]:
    """The settings of a config file and of every file it builds on, the root's first, with the problems found."""
    settings: list[Setting] = []
    errors: list[str] = []
    for level, f in enumerate(config_chain(name_or_path, default_recipe)):
        found, problems = file_settings(f.sections, f.shown, sections, level)
        settings, errors = settings + found, errors + problems
    return settings, errors


def find_base(base: Any, naming: Path) -> Path:
    """The file a `base:` value names: a path beside the naming file or from the current folder, a run folder (its
    config.yaml), or a shipped config's name."""
    where = shown_path(naming)
    if not isinstance(base, str) or not base.strip():
        raise UsageError(
            f"{where}: base must name the config this one builds on (a shipped name such as cpu, a path, a run "
            f"folder, or '{SCHEMA_DEFAULTS}' for the built-in defaults), got {base!r}"
        )
    beside = naming.parent / base
    try:
        return find_config(str(beside) if beside.exists() and not Path(base).is_absolute() else base)
    except UsageError:
        shipped = ", ".join(shipped_config_names())
        raise UsageError(
            f"{where}: its base '{base}' was not found beside it, in the current folder or among the shipped configs "
            f"({shipped}); fix the name or path, or write base: {SCHEMA_DEFAULTS} for the built-in defaults"
        ) from None


# ---------------------------------------------------------------------------- overrides


@dataclass
class Setting:
    """One value for a dotted key, remembering where the user gave it (for error messages)."""

    key: str
    value: Any
    source: str
    level: int = 0  # who outranks whom: the configs of a chain from 0 (its root) up, then COMMAND_LINE


COMMAND_LINE = 1 << 30  # --set and first-class options outrank every config file
Options = dict[str, tuple[str, Any]]  # dotted key -> (the flag the user typed, its value or None if not given)


def parse_set(item: str) -> Setting:
    """`section.key=value`, the value parsed as a YAML scalar ("3" -> 3, "true" -> True, "1e-3" -> 0.001)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or "." not in key:
        raise UsageError(f"--set expects section.key=value, got {item!r} (e.g. --set train.lr=3e-4)")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    if isinstance(value, dict):
        value = text  # no mappings: keep the text and let the type check name the key
    return Setting(key, _yaml_float(value), f"--set {item}", COMMAND_LINE)


def _yaml_float(value: Any) -> Any:
    # YAML 1.1 reads "1e-3" as a string (it wants "1.0e-3"); users mean a number.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in "eE.") or value.strip().lower() in ("inf", "nan") else value
        except ValueError:
            return value
    return value


def option_settings(options: Options) -> list[Setting]:
    """First-class CLI options; those not given (None) leave the key alone."""
    return [Setting(key, value, flag, COMMAND_LINE) for key, (flag, value) in options.items() if value is not None]


def suggestion(word: str, options: list[str], prefix: str = "") -> str:
    """A message's ending: the closest option, or the list of them."""
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid: {', '.join(prefix + o for o in options)}"


def file_settings(
    raw: dict[str, Any], source: str, sections: Mapping[str, list[str]], level: int = 0
) -> tuple[list[Setting], list[str]]:
    """A config file's settings; `sections` maps each section to its keys. Each top-level key is checked to be a
    section first: an unknown one is named even when it holds nothing, and a key written at the top (`n_layer: 2`,
    or dotted as `--set` writes it: `model.n_layer: 2`) is told how a file nests it."""
    settings, errors = [], []
    for section, body in raw.items():
        head, dot, tail = str(section).partition(".")
        owner = head if dot and head in sections else next((s for s, keys in sections.items() if section in keys), "")
        if section not in sections:
            nest = f"write '{owner}:' and on the next line '  {tail or section}: ...'"
            errors.append(
                f"unknown section '{section}' ({source}): a config file nests each key under its section: {nest}"
                if owner
                else f"unknown section '{section}' ({source}){suggestion(str(section), list(sections))}"
            )
            continue
        if not isinstance(body, dict):
            errors.append(f"{section}: expected a mapping of keys under '{section}:' ({source})")
            continue
        for key, value in body.items():
            settings.append(Setting(f"{section}.{key}", _yaml_float(value), source, level))
    return settings, errors
