"""How to continue a text: one record of decoding options for the command line, the Python API, the REPL, the
server and transduction, and the one check of their values (each surface spells the names its own way)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from numbers import Integral, Real
from typing import Any

from charlm.config.schema import MAX_TEMPERATURE, SampleConfig
from charlm.errors import UsageError

MAX_BEAM = 64
WHOLE = ("max_new_tokens", "top_k", "seed", "num_samples", "beam", "batch_size")  # options that count
FRACTIONAL = ("temperature", "top_p")
MAX_FILL_CANDIDATES = 50  # charlm fill --top, Model.fill(top=)


def flag_name(name: str) -> str:
    """How the command line spells an option: top_p -> --top-p."""
    return "--" + name.replace("_", "-")


def field_name(name: str) -> str:
    """How the Python API and the server's JSON spell an option: top_p."""
    return name


class OptionError(UsageError):
    """An option's value is out of range; `option` is its field name (the server reports it as the error's param)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


@dataclass
class DecodeOptions:
    """Everything that decides a continuation besides the model and the prompt."""

    max_new_tokens: int = 500
    temperature: float = 0.8  # 0: greedy
    top_k: int | None = None  # keep the k most likely characters (ties with the k-th kept); None keeps all
    top_p: float = 1.0  # nucleus: the smallest set reaching p (0 keeps the most likely character alone)
    seed: int | None = None  # None: a fresh draw each time
    num_samples: int = 1  # texts decoded together as one batch, each from the same prompt
    stop: list[str] = field(default_factory=list)  # the text ends just before the first one, which is left out
    use_cache: bool = True
    compile: bool = False  # single positions through a compiled step (charlm/decoding/compiled.py); needs use_cache
    beam: int = 1  # transduction: N > 1 is beam search (most likely targets; no temperature, top-k or top-p)
    batch_size: int = 64  # transduction: sources decoded together

    @classmethod
    def from_config(cls, defaults: SampleConfig, **overrides: Any) -> DecodeOptions:
        """The checkpoint's sample section, with every override that is not None on top."""
        values = {k: getattr(defaults, k) for k in ("max_new_tokens", "temperature", "top_k", "top_p")}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> DecodeOptions:
        return replace(self, **changes)

    def checked(self, spell: Callable[[str], str] = flag_name) -> DecodeOptions:
        """These options, or OptionError naming the first value out of range as `spell` writes its name."""
        check_values(vars(self), spell)
        plain: dict[str, Any] = {k: int(v) for k in WHOLE if (v := getattr(self, k)) is not None}  # numpy's too
        plain |= {k: float(v) for k in FRACTIONAL if (v := getattr(self, k)) is not None}
        return replace(self, **plain)


def check_values(given: dict[str, Any], spell: Callable[[str], str] = flag_name) -> None:
    """The one check of decoding options, on any subset of DecodeOptions' fields (None: left to the default)."""
    unknown = set(given) - {f.name for f in fields(DecodeOptions)}
    if unknown:
        raise TypeError(f"not decoding options: {sorted(unknown)}")

    def refuse(name: str, rule: str) -> None:
        raise OptionError(name, f"{spell(name)} must be {rule}, got {given[name]!r}")

    for name in WHOLE:  # the Python API's callers
        if given.get(name) is not None and (isinstance(given[name], bool) or not isinstance(given[name], Integral)):
            refuse(name, "a whole number")  # numpy's integers are Integral too
    for name in FRACTIONAL:
        if given.get(name) is not None and (isinstance(given[name], bool) or not isinstance(given[name], Real)):
            refuse(name, "a number")
    for name, low in (("max_new_tokens", 0), ("temperature", 0.0), ("top_k", 1), ("num_samples", 1)):
        if given.get(name) is not None and not given[name] >= low:  # NaN too
            refuse(name, f">= {low}" + (" (0 = greedy)" if name == "temperature" else ""))
    if given.get("temperature") is not None and math.isinf(given["temperature"]):
        refuse("temperature", "finite (0 = greedy; a large one draws nearly uniformly)")
    if given.get("temperature") is not None and given["temperature"] > MAX_TEMPERATURE:
        refuse("temperature", f"at most {MAX_TEMPERATURE:g} (0 = greedy; above it the draw is uniform in effect)")
    if given.get("seed") is not None and not -(2**63) <= given["seed"] < 2**63:
        refuse("seed", "between -2**63 and 2**63 - 1 (a 64-bit integer)")
    if given.get("top_p") is not None and not 0.0 <= given["top_p"] <= 1.0:
        refuse("top_p", "between 0 and 1 (1 keeps every character, 0 only the most likely)")
    if given.get("beam") is not None and not 1 <= given["beam"] <= MAX_BEAM:
        refuse("beam", f"between 1 and {MAX_BEAM}")
    if given.get("batch_size") is not None and given["batch_size"] < 1:
        refuse("batch_size", ">= 1")
    if any(not isinstance(s, str) or not s for s in given.get("stop") or []):
        raise OptionError("stop", f"{spell('stop')} needs non-empty strings")
    if given.get("compile") and given.get("use_cache") is False:
        raise OptionError("compile", "--compile compiles the cached decoding step: leave out --no-cache")
    sampling = (given.get("temperature") or 0) > 0 or given.get("top_k") is not None or (given.get("top_p") or 1) < 1
    if (given.get("beam") or 1) > 1 and sampling:
        raise OptionError(
            "beam", "beam search keeps the most likely targets: leave temperature, top-k and top-p out of it"
        )
