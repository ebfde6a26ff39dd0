"""Where each key of a resolved config got its value (a default, a config file of its chain, the command line),
and the config as YAML with that origin beside every key: what `charlm config` prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from charlm.config.build import traced_config
from charlm.config.checks import GIVEN_SPLITS
from charlm.config.schema import DEFAULT_CONFIG, Config, Options
from charlm.config.sources import config_chain

DEFAULT_ORIGIN = "default"  # the schema's own value: no file and no option set the key
GIVEN_SPLIT_KEYS = {key for keys in GIVEN_SPLITS.values() for key in keys}


def key_origins(path: str | Path | None, sets: list[str], options: Options | None = None) -> tuple[Config, dict]:
    """The config load_config resolves, and for each `section.key` what gave its value (the last setting of it)."""
    config, settings = traced_config(path, sets, options)
    values = config.flat()
    origins = dict.fromkeys(values, DEFAULT_ORIGIN)
    for s in settings:
        # a split's fraction put back to its default beside a split file given above it is the default's again
        origins[s.key] = s.source if s.value == values[s.key] or s.key not in GIVEN_SPLIT_KEYS else DEFAULT_ORIGIN
    return config, origins


def chain_names(path: str | Path) -> list[str]:
    """The files a config builds on, the root first, as messages name them."""
    return [f.shown for f in config_chain(str(path), DEFAULT_CONFIG)]


def _yaml_line(key: str, value: Any) -> str:
    """`key: value` on one line: YAML's own form where it fits one line, else JSON (which YAML reads too)."""
    text = yaml.safe_dump({key: value}, default_flow_style=False, sort_keys=False, width=1 << 30).rstrip("\n")
    return text if "\n" not in text else f"{key}: {json.dumps(value)}"


def annotated_yaml(config: Config, origins: dict[str, str], chain: list[str]) -> str:
    """The config as YAML that loads back to it, a comment after each key naming where its value came from."""
    lines = [
        "# The resolved configuration: after each key, where its value came from (default: the built-in value).",
        f"# Config files, each changing the one before: {' <- '.join(chain)}" if chain else "# No config file.",
    ]
    for section, body in config.to_dict().items():
        rows = [(f"  {_yaml_line(key, value)}", origins[f"{section}.{key}"]) for key, value in body.items()]
        width = max(len(row) for row, _ in rows)
        lines += [f"{section}:", *(f"{row.ljust(width)}  # {origin}" for row, origin in rows)]
    return "\n".join(lines) + "\n"
