"""A sweep's spec file read and checked before any trial starts (each mistake one line naming it), and each trial's
configuration built from it: the base config, the fixed keys, the budget, then the trial's values (docs/sweeps.md).

Every key is checked by the config's own validation (charlm.config.schema: known key, type, range), each candidate
value on its own; keys that must agree with each other are checked for every combination of a grid, and for a
sampled trial when it is drawn (a combination that cannot be a config fails that trial, with its reason).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from charlm.config import schema as cfg
from charlm.config.build import load_config, setting_problem
from charlm.config.schema import Config, Setting
from charlm.config.sources import load_yaml, suggestion
from charlm.errors import UsageError
from charlm.training.budget_rule import parse_budget

SAMPLERS = ("grid", "random", "tpe")
SPEC_KEYS = ("config", "set", "budget", "trials", "sampler", "prune", "seed", "params")
PARAM_KEYS = ("choices", "low", "high", "log", "int")
BUDGET_KEYS = ("time", "steps")
LIMITS = ("train.max_seconds", "train.max_steps")  # each trial's budget: the spec's `budget:` sets them
GRID_CHECK_LIMIT = 5000  # combinations of a grid built as configs before the sweep starts


@dataclass(frozen=True)
class Param:
    """One swept key: a list of choices, or a range (log-scaled, integers)."""

    key: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    def describe(self) -> dict[str, Any]:
        return asdict(self) | {"choices": None if self.choices is None else list(self.choices)}


@dataclass(frozen=True)
class SweepSpec:
    path: Path
    config: str | None  # the base config's name or path (None: the default, cpu)
    fixed: dict[str, Any]  # `set:`, every trial alike
    seconds: float  # each trial's train.max_seconds (0: no time limit)
    steps: int  # each trial's train.max_steps (0: no step limit)
    trials: int
    sampler: str
    prune: bool
    seed: int
    params: tuple[Param, ...]

    def identity(self) -> dict[str, Any]:
        """What makes two specs the same sweep (the number of trials may grow: a sweep can be lengthened)."""
        raw = {
            "config": self.config,
            "set": self.fixed,
            "budget": {"seconds": self.seconds, "steps": self.steps},
            "sampler": self.sampler,
            "prune": self.prune,
            "seed": self.seed,
            "params": [p.describe() for p in self.params],
        }
        return json.loads(json.dumps(raw))

    def trial_config(self, values: dict[str, Any]) -> Config:
        """The base config, the fixed keys, the budget, then this trial's values; every problem in one UsageError."""
        where = self.path.name
        options: cfg.Options = {key: (f"{where} set: {key}", value) for key, value in self.fixed.items()}
        options |= {"train.max_seconds": (f"{where} budget", self.seconds)}
        options |= {"train.max_steps": (f"{where} budget", self.steps)}
        options |= {key: (f"{where} params: {key}={value!r}", value) for key, value in values.items()}
        return load_config(self.config or cfg.DEFAULT_CONFIG, [], options)

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of the choices, the first key's changing slowest."""
        keys = [p.key for p in self.params]
        return [
            dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(p.choices or () for p in self.params))
        ]


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a spec; a UsageError naming every problem (one line for one) before anything runs."""
    path = find_spec(path)
    raw = _read(path)
    where = path.name
    errors: list[str] = []
    for key in raw:
        if key not in SPEC_KEYS:
            errors.append(f"{where}: unknown key '{key}'{suggestion(str(key), list(SPEC_KEYS))}")
    config = raw.get("config")
    if config is not None and not isinstance(config, str):
        errors.append(f"{where} config: expected a config's name or path, got {config!r}")
        config = None
    if config is not None:  # said beside the spec's other problems, not after they are mended
        try:
            cfg.find_config(config)
        except UsageError as e:
            errors.append(f"{where} config: {e}")
    fixed = _fixed(raw.get("set"), where, errors)
    seconds, steps = _budget(raw.get("budget"), where, errors)
    sampler = raw.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        errors.append(f"{where} sampler: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
    prune = raw.get("prune", False)
    if not isinstance(prune, bool):
        errors.append(f"{where} prune: expected true or false, got {prune!r}")
    seed = _count(raw.get("seed", 0), f"{where} seed", errors, minimum=0)
    params = _params(raw.get("params"), where, fixed, errors)
    trials = raw.get("trials")
    if trials is None and sampler != "grid":
        errors.append(f"{where}: trials is missing; say how many trials to run (trials: 20)")
    elif trials is not None:
        trials = _count(trials, f"{where} trials", errors, minimum=1)
    if sampler == "grid":
        trials = _grid_trials(params, trials, where, errors)
    if errors:
        _raise(path, errors)
    assert trials is not None  # given, or the grid's size
    spec = SweepSpec(path, config, fixed, seconds, steps, trials, sampler, prune, seed, tuple(params))
    _check_configs(spec)
    return spec


def find_spec(name_or_path: str | Path) -> Path:
    """A path as given, or the name of a shipped spec (configs/sweeps/NAME.yaml: "cpu-shape")."""
    path = Path(name_or_path)
    if path.is_file() or path.parent != Path("."):
        return path
    stem = path.name[:-5] if path.name.endswith(".yaml") else path.name
    for folder in cfg.CONFIG_DIRS:
        if (folder / "sweeps" / f"{stem}.yaml").is_file():
            return folder / "sweeps" / f"{stem}.yaml"
    return path


def shipped_spec_names() -> list[str]:
    for folder in cfg.CONFIG_DIRS:
        if (folder / "sweeps").is_dir():
            return sorted(p.stem for p in (folder / "sweeps").glob("*.yaml"))
    return []


def _read(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise UsageError(f"sweep spec {path} is a folder: give the spec's YAML file (docs/sweeps.md shows the format)")
    if not path.is_file():
        shipped = ", ".join(shipped_spec_names()) or "none found"
        raise UsageError(f"sweep spec not found: {path} (give a YAML file, or a shipped spec's name: {shipped})")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        said = getattr(e, "problem", None)
        problem = f": {said}" if isinstance(said, str) else ""
        raise UsageError(
            f"sweep spec {path} is not valid YAML{at}{problem}; fix it (docs/sweeps.md shows the format)"
        ) from e
    if not isinstance(raw, dict):
        raise UsageError(f"sweep spec {path} must hold a mapping (config, set, budget, trials, sampler, params)")
    return raw


def _raise(path: Path, errors: list[str]) -> None:
    if len(errors) == 1:
        raise UsageError(errors[0])
    raise UsageError(f"{len(errors)} problems in the sweep spec {path}:", details=errors)


def _count(value: Any, what: str, errors: list[str], minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        errors.append(f"{what}: expected a whole number >= {minimum}, got {value!r}")
        return minimum
    return value


def _fixed(raw: Any, where: str, errors: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.append(f"{where} set: expected a mapping of keys to values (model.n_layer: 4)")
        return {}
    fixed = {}
    for key, value in raw.items():
        key = str(key)
        if key in LIMITS:
            errors.append(f"{where} set: {key} is each trial's limit: give it as the spec's budget (docs/sweeps.md)")
            continue
        problem = setting_problem(Setting(key, value, f"{where} set"))
        if problem:
            errors.append(problem)
        fixed[key] = value
    return fixed


def _budget(raw: Any, where: str, errors: list[str]) -> tuple[float, int]:
    """`budget: 10m` (each trial's time), or `budget: {time: 10m, steps: 500}` (either or both)."""
    if raw is None:
        errors.append(
            f"{where}: budget is missing; give each trial a time (budget: 5m) or steps (budget: {{steps: 500}})"
        )
        return 0.0, 0
    body = raw if isinstance(raw, dict) else {"time": raw}
    for key in body:
        if key not in BUDGET_KEYS:
            errors.append(f"{where} budget: unknown key '{key}'{suggestion(str(key), list(BUDGET_KEYS))}")
    seconds, steps = 0.0, 0
    time = body.get("time")
    if isinstance(time, (int, float)) and not isinstance(time, bool):  # as --budget: a unit, never a guess at one
        errors.append(f"{where} budget: time {time!r} has no unit: give a duration such as {time:g}s, 10m or 1h")
    elif isinstance(time, str):
        try:
            seconds = parse_budget(time, flag=f"{where} budget: time")
        except UsageError as e:
            errors.append(str(e))
    elif time is not None:
        errors.append(f"{where} budget: time must be a duration such as 300s, 10m or 1h, got {time!r}")
    if body.get("steps") is not None:
        steps = _count(body["steps"], f"{where} budget: steps", errors, minimum=1)
    if "time" not in body and "steps" not in body:
        errors.append(f"{where} budget: give a time (300s, 10m, 1h), steps, or both")
    return seconds, steps


def _params(raw: Any, where: str, fixed: dict[str, Any], errors: list[str]) -> list[Param]:
    if raw is not None and not isinstance(raw, dict):
        errors.append(f"{where}: params must map each key to its choices or range (docs/sweeps.md), got {raw!r}")
        return []
    if not raw:
        errors.append(f"{where}: params is missing or empty; name the keys to sweep (docs/sweeps.md)")
        return []
    params = []
    for key, body in raw.items():
        key = str(key)
        source = f"{where} params: {key}"
        if key in LIMITS:
            errors.append(f"{source}: each trial's limit is the spec's budget, not a swept key")
            continue
        if key in fixed:
            errors.append(f"{source}: the key is also under set: (fixed); keep it in one place")
            continue
        if not isinstance(body, dict):
            errors.append(f"{source}: expected choices: [...] or low:/high: (with log: or int: true)")
            continue
        unknown = [k for k in body if k not in PARAM_KEYS]
        if unknown:
            errors.append(f"{source}: unknown key '{unknown[0]}'{suggestion(str(unknown[0]), list(PARAM_KEYS))}")
            continue
        param = _param(key, body, source, errors)
        if param is not None:
            params.append(param)
    return params


_NONE = object()  # no choice found twice


def _same(a: Any, b: Any) -> bool:
    """Two choices that make the same trial: equal and of one kind (1 and true are not the same choice)."""
    return type(a) is type(b) and a == b


def _param(key: str, body: dict[str, Any], source: str, errors: list[str]) -> Param | None:
    if "choices" in body:
        if any(k in body for k in ("low", "high", "log", "int")):
            errors.append(f"{source}: give either choices or a range (low, high), not both")
            return None
        choices = body["choices"]
        if not isinstance(choices, list):
            errors.append(f"{source}: choices must be a list, got {choices!r} (choices: [{choices!r}] for one value)")
            return None
        if not choices:
            errors.append(f"{source}: choices is empty; list at least one value")
            return None
        twice = next((c for i, c in enumerate(choices) if any(_same(c, d) for d in choices[:i])), _NONE)
        if twice is not _NONE:
            errors.append(f"{source}: choices lists {twice!r} twice; list each value once")
            return None
        for value in choices:
            if isinstance(value, (list, dict)):
                errors.append(f"{source}: each choice must be a single value (number, string, true/false, null)")
                return None
            problem = setting_problem(Setting(key, value, source))
            if problem:
                errors.append(problem)
                return None
        return Param(key, choices=tuple(choices))
    log, integer = body.get("log", False), body.get("int", False)
    low, high = body.get("low"), body.get("high")
    if not (_number(low) and _number(high)):
        errors.append(f"{source}: a range needs numbers low and high, got low {low!r}, high {high!r}")
        return None
    assert isinstance(low, (int, float)) and isinstance(high, (int, float))
    if not isinstance(log, bool) or not isinstance(integer, bool):
        errors.append(f"{source}: log and int are true or false")
        return None
    if low >= high:
        errors.append(f"{source}: the range is empty (low {low} must be below high {high})")
        return None
    if log and low <= 0:
        errors.append(f"{source}: a log-scaled range needs low above 0, got {low}")
        return None
    if integer and not (float(low).is_integer() and float(high).is_integer()):
        errors.append(f"{source}: an int range needs whole-number ends, got {low} and {high}")
        return None
    ends = (int(low), int(high)) if integer else (float(low), float(high))
    probes = [*ends] if integer else [*ends, (ends[0] + ends[1]) / 2]  # a float: an integer key refuses it
    for value in probes:
        problem = setting_problem(Setting(key, value, source))
        if problem:
            hint = " (an integer key takes int: true)" if "expected an integer" in problem else ""
            errors.append(problem + hint)
            return None
    return Param(key, low=ends[0], high=ends[1], log=log, integer=integer)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _grid_trials(params: list[Param], trials: int | None, where: str, errors: list[str]) -> int:
    ranged = [p.key for p in params if p.choices is None]
    if ranged:
        errors.append(f"{where}: sampler grid needs choices for every key; {ranged[0]} has a range (or use random/tpe)")
        return 1
    size = math.prod(len(p.choices or ()) for p in params)
    if trials is not None and trials > size:
        errors.append(f"{where} trials: {trials} is more than the grid's {size} combinations; leave trials out")
    return min(trials or size, size)


def _check_configs(spec: SweepSpec) -> None:
    """The fixed part as a config (base, set, budget), then each combination of a grid, before any trial starts."""
    spec.trial_config({})
    if spec.sampler != "grid":
        return
    for values in spec.grid()[: min(spec.trials, GRID_CHECK_LIMIT)]:
        try:
            spec.trial_config(values)
        except UsageError as e:
            combo = ", ".join(f"{k}={v}" for k, v in values.items())
            first = e.details[0] if e.details else str(e)
            raise UsageError(
                f"{spec.path.name}: the grid's combination {combo} is not a valid config: {first}"
            ) from None
