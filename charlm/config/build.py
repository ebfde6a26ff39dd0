"""A run's configuration built and validated in one place: the precedence chain (defaults < the YAML files a config
builds on (`base:`) < the YAML file < `--set section.key=value` < first-class CLI options), every problem collected
and reported at once, each naming the dotted key the user typed."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from charlm.config.checks import config_problems, settle_given_splits, value_problem
from charlm.config.schema import DEFAULT_CONFIG, SECTION_KEYS, SECTIONS, Config
from charlm.config.sources import (
    Options,
    Setting,
    chain_settings,
    file_settings,
    option_settings,
    parse_set,
    suggestion,
)
from charlm.config.values import coerce, describe_type, field_types, within_later_bounds
from charlm.errors import UsageError


def build_config(settings: list[Setting]) -> Config:
    """Apply settings in order over the defaults; raise one UsageError listing every problem."""
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    errors: list[str] = []
    for s in settings:
        problem = _apply(values, s)
        if problem:
            errors.append(problem)
    config = Config(**{name: SECTIONS[name](**values[name]) for name in SECTIONS})
    errors += config_problems(config)
    raise_all(errors)
    return config


def raise_all(errors: list[str]) -> None:
    """One UsageError carrying every problem: one line for one, a count and a line each for several."""
    if len(errors) == 1:
        raise UsageError(errors[0])
    if errors:
        raise UsageError(f"{len(errors)} problems in the configuration:", details=errors)


def _apply(values: dict[str, dict[str, Any]], s: Setting) -> str | None:
    section, _, key = s.key.partition(".")
    if section not in SECTIONS:
        return f"unknown section '{section}' in '{s.key}' ({s.source}){suggestion(section, list(SECTIONS))}"
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    if key not in fields:
        return f"unknown key '{s.key}' ({s.source}){suggestion(key, list(fields), prefix=section + '.')}"
    hint = field_types(SECTIONS[section])[key]
    ok, value = coerce(s.value, hint)
    if not ok:
        return f"{s.key}: expected {describe_type(hint)}, got {s.value!r} ({s.source})"
    values[section][key] = value
    return None


def setting_problem(s: Setting, values: dict[str, dict[str, Any]] | None = None) -> str | None:
    """One value checked on its own as build_config checks it (a known key, its type, its range), for values that
    meet the rest of a config only later (a sweep's candidates); keys that must agree are checked with the config.
    The typed value goes into `values` (section -> key -> value) when given."""
    values = values if values is not None else {name: {} for name in SECTIONS}
    problem = _apply(values, s)
    if problem is not None:
        return problem
    section, _, key = s.key.partition(".")
    meta = next(f.metadata for f in dataclasses.fields(SECTIONS[section]) if f.name == key)
    found = value_problem(values[section][key], meta)
    return f"{s.key}: {found}, got {s.value!r} ({s.source})" if found else None


def load_config(path: str | Path | None, sets: Sequence[str] = (), options: Options | None = None) -> Config:
    """The whole precedence chain: defaults < the files a config builds on < the file < --set items < options."""
    return traced_config(path, sets, options)[0]


def traced_config(
    path: str | Path | None, sets: Sequence[str] = (), options: Options | None = None
) -> tuple[Config, list[Setting]]:
    """load_config, with the settings it applied in order (the last one of a key gave its value)."""
    settings, errors = chain_settings(str(path), DEFAULT_CONFIG, SECTION_KEYS) if path is not None else ([], [])
    settings += [parse_set(item) for item in sets] + option_settings(options or {})
    config = _build_reporting_all(settings, errors)
    raise_all(settle_given_splits(config, settings))
    return config, settings


def _build_reporting_all(settings: list[Setting], errors: list[str]) -> Config:
    """build_config, with the problems already found (malformed sections) reported in the same message."""
    try:
        config = build_config(settings)
    except UsageError as e:
        raise_all(errors + (e.details or [str(e)]))
    raise_all(errors)
    return config


def explicit_settings(sets: list[str], options: Options) -> dict[str, Any]:
    """Only what the user gave on the command line, each value checked on its own: they meet the rest of a config
    later (a resumed run's, an --init-from source's model), where the keys that must agree are checked."""
    settings = [parse_set(item) for item in sets] + option_settings(options)
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    raise_all([problem for s in settings if (problem := setting_problem(s, values))])
    return {s.key: values[s.key.split(".")[0]][s.key.split(".")[1]] for s in settings}


def config_from_dict(raw: dict[str, Any], source: str) -> Config:
    """Rebuild a Config saved in a checkpoint (keys added since then take their defaults); all problems at once."""
    settings, errors = file_settings(within_later_bounds(raw), source, SECTION_KEYS)
    return _build_reporting_all(settings, errors)
