"""The checks of a whole config beyond each value's type: ranges, keys that must agree with each other and with
model.arch, and the device name (no torch imported here)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from charlm.config.arch_rules import arch_problems
from charlm.config.sources import Setting


def config_problems(config: Any) -> list[str]:
    """Every value out of its range and every pair of keys that disagree, each naming its key (config: a
    charlm.config.schema.Config, which imports this module)."""
    errors = []
    for section in (f.name for f in dataclasses.fields(config)):
        obj = getattr(config, section)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None or isinstance(value, (bool, str, list)):
                continue
            problem = _range_problem(value, f.metadata)
            if problem:
                errors.append(f"{section}.{f.name}: {problem}, got {value!r}")
    m = config.model
    shape_ok = m.n_embd >= 1 and m.n_head >= 1  # cross-key checks only once each key is valid on its own
    if shape_ok and m.n_embd % m.n_head:
        errors.append(f"model.n_embd ({m.n_embd}) must be divisible by model.n_head ({m.n_head})")
    if shape_ok and m.pos_encoding == "rope" and m.n_embd % m.n_head == 0 and (m.n_embd // m.n_head) % 2:
        errors.append(f"model.pos_encoding rope needs an even head size, but n_embd / n_head = {m.n_embd // m.n_head}")
    if m.n_experts and m.expert_top_k > m.n_experts:
        errors.append(f"model.expert_top_k ({m.expert_top_k}) must be at most model.n_experts ({m.n_experts})")
    errors += arch_problems(config.model, config.data)
    if config.data.unknown_dropout and config.data.format != "pairs":
        errors.append(
            f"data.unknown_dropout ({config.data.unknown_dropout}) is for data.format pairs (source characters read "
            "as the unknown symbol); set it to 0 or use pairs"
        )
    if config.data.columns != "source-target" and config.data.format != "pairs":
        errors.append(
            f"data.columns ({config.data.columns}) is for data.format pairs (a features column beside source and "
            "target); leave it at source-target or use pairs"
        )
    if not config.data.feature_separator or any(c in "\t\r\n" for c in config.data.feature_separator):
        errors.append(
            f"data.feature_separator must be one or more characters other than a tab or a newline, got "
            f"{config.data.feature_separator!r}"
        )
    if config.data.hallucinate and config.data.format != "pairs":
        errors.append(f"data.hallucinate ({config.data.hallucinate}) makes synthetic pairs; set it to 0 or use pairs")
    if config.data.recombine and (config.data.format != "pairs" or config.data.columns != "source-target"):
        errors.append(
            f"data.recombine ({config.data.recombine}) joins words of source<TAB>target pairs (data.columns "
            "source-target); set it to 0, or use data.hallucinate for a features column"
        )
    if config.train.best_by == "accuracy" and config.data.format != "pairs":
        errors.append(
            "train.best_by accuracy decodes the validation lines of pairs (an encoder-decoder's); leave it at loss"
        )
    if config.train.max_steps == 0 and config.train.max_seconds == 0:
        errors.append("train.max_steps and train.max_seconds are both 0: set at least one limit")
    if not valid_device_name(config.train.device):
        errors.append(f"train.device: expected {DEVICE_NAMES}, got {config.train.device!r}")
    return errors


DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"


def valid_device_name(name: str) -> bool:
    """The one check of a device name, for train.device and the --device options."""
    return name in ("auto", "cpu", "cuda", "mps") or (name.startswith("cuda:") and name[5:].isdigit())


def value_problem(value: Any, meta: Mapping[str, Any]) -> str | None:
    """One key's value against the range its field's metadata sets (None, booleans, strings and lists have none)."""
    if value is None or isinstance(value, (bool, str, list)):
        return None
    return _range_problem(value, meta)


def _range_problem(value: float, meta: Mapping[str, Any]) -> str | None:
    if not math.isfinite(value):
        return "must be a finite number"
    if "ge" in meta and value < meta["ge"]:
        return f"must be >= {meta['ge']}"
    if "gt" in meta and value <= meta["gt"]:
        return f"must be > {meta['gt']}"
    if "le" in meta and value > meta["le"]:
        return f"must be <= {meta['le']}"
    if "lt" in meta and value >= meta["lt"]:
        return f"must be < {meta['lt']}"
    return None


GIVEN_SPLITS = {"val": ("data.val_fraction", "data.val_size"), "test": ("data.test_fraction", "data.test_size")}


def settle_given_splits(config: Any, settings: list[Setting]) -> list[str]:
    """Settle each split given as a file against its fractions, returning what is refused. A split is either a given
    file or carved from data.path, so a fraction or size other than its default beside its file is refused. The
    command line outranks a config file, and a config file the configs it builds on (Setting.level): a fraction
    yields to a path given at a higher level and is put back to its default here (so the run's saved config.yaml
    loads as it is); set at the same level, or the fraction higher, they are refused. Values at their defaults are
    never asked about: a saved config holds every key."""
    problems = []
    defaults = type(config.data)()
    for split, keys in GIVEN_SPLITS.items():
        given = getattr(config.data, f"{split}_path")
        if not given:
            continue
        path_level = max(s.level for s in settings if s.key == f"data.{split}_path")
        for key in keys:
            name = key.removeprefix("data.")
            if getattr(config.data, name) == getattr(defaults, name):
                continue
            last = max(i for i, s in enumerate(settings) if s.key == key)  # the setting that gave the value
            if settings[last].level >= path_level:
                problems.append(
                    f"{key} ({settings[last].source}) and data.{split}_path={given} both choose the {split} split: "
                    f"the given file is used as it is, so remove {key}"
                )
            else:  # a fraction of a config below, yielding to the file named above it
                setattr(config.data, name, getattr(defaults, name))
    return problems
