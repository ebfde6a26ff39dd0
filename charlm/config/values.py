"""The types of a config section's keys, how a value from YAML or `--set` becomes one, and how a type is named in
messages (for charlm.config.schema's validation and the key reference)."""

from __future__ import annotations

import functools
import math
import types
import typing
from typing import Any, Literal


@functools.cache
def field_types(section: type) -> dict[str, Any]:
    """A config section's keys and their types, read once: typing.get_type_hints evaluates every annotation of the
    class each time it is called, and a checkpoint's config sets some 90 keys."""
    return typing.get_type_hints(section)


def coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return True, None
        return coerce(value, next(a for a in args if a is not type(None)))
    if origin is list:
        items = value if isinstance(value, list) else [value]  # `--set train.loggers=csv` means [csv]
        coerced = [coerce(item, typing.get_args(hint)[0]) for item in items]
        return all(ok for ok, _ in coerced), [v for _, v in coerced]
    if origin is Literal:
        choices = typing.get_args(hint)
        if isinstance(value, bool) and "true" in choices:  # YAML reads `compile: true` as a bool
            value = "true" if value else "false"
        return (value in choices), value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return (isinstance(value, int) and not isinstance(value, bool)), value
    if hint is float:  # ints are accepted where floats are expected
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        return ok, float(value) if ok else value
    if hint is str:
        return isinstance(value, str), value
    return False, value


def describe_type(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(hint) if a is not type(None))
        return f"{describe_type(inner)} or null"
    if origin is Literal:
        return "one of " + ", ".join(str(c) for c in typing.get_args(hint))
    if origin is list:
        return f"a list, each {describe_type(typing.get_args(hint)[0])}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


# A draw above it is uniform in effect; past float32's range (3.4e38) the scaled logits are 0 and top-k/p keep nothing
MAX_TEMPERATURE = 1e4


def within_later_bounds(saved: dict[str, Any]) -> dict[str, Any]:
    """A config saved in a checkpoint, its values bounded since then brought within the bounds, where they change
    nothing: a sample.temperature above MAX_TEMPERATURE (uniform in effect either way) loads as MAX_TEMPERATURE."""
    sample = saved.get("sample")
    temperature = sample.get("temperature") if isinstance(sample, dict) else None
    if isinstance(temperature, (int, float)) and temperature > MAX_TEMPERATURE:
        return {**saved, "sample": {**sample, "temperature": MAX_TEMPERATURE}}  # type: ignore[dict-item]
    return saved
