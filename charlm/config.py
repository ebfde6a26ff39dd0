"""Typed configuration: dataclasses with defaults, loaded from YAML and overrides, validated in one place.

Precedence: dataclass defaults < YAML file < `--set section.key=value` < first-class CLI options.
Every problem is collected and reported at once, each naming the dotted key the user typed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from charlm.errors import UsageError

# Where the shipped configs live: `configs/` beside the package in a source checkout, or the
# copy that the wheel installs as `charlm/_configs`.
_PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG_DIRS = (_PACKAGE_DIR.parent / "configs", _PACKAGE_DIR / "_configs")
DEFAULT_CONFIG = "cpu"


def documented(default: Any, help: str, **checks: Any) -> Any:
    """A dataclass field with its help text and range checks (ge, gt, le, lt) kept as metadata."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, "default": default, **checks})
    return field(default=default, metadata={"help": help, **checks})


Logger = Literal["jsonl", "csv", "tensorboard", "wandb"]


@dataclass
class DataConfig:
    path: str = documented("data/tinyshakespeare.txt", "UTF-8 text file to train on (downloaded when it is the default and missing)")
    val_fraction: float = documented(0.1, "last fraction of the text held out for validation", gt=0.0, lt=1.0)


@dataclass
class ModelConfig:
    n_layer: int = documented(4, "number of Transformer blocks", ge=1)
    n_head: int = documented(4, "attention heads per block (must divide n_embd)", ge=1)
    n_embd: int = documented(128, "width of the residual stream", ge=1)
    block_size: int = documented(64, "context length in characters", ge=1)
    dropout: float = documented(0.0, "dropout probability in attention, MLP and embeddings", ge=0.0, lt=1.0)
    bias: bool = documented(True, "biases in Linear layers and LayerNorms")
    pos_encoding: Literal["learned", "sinusoidal", "rope", "alibi"] = documented(
        "learned", "positions: learned or sinusoidal (absolute, added to embeddings); rope or alibi (relative, in attention)"
    )
    norm: Literal["layernorm", "rmsnorm"] = documented("layernorm", "normalisation layer")
    norm_position: Literal["pre", "post"] = documented("pre", "pre: x + f(norm(x)) (GPT-2); post: norm(x + f(x)) (original paper)")
    activation: Literal["relu", "gelu", "swiglu"] = documented("gelu", "feed-forward activation (swiglu uses 2/3 of the hidden width)")
    ffn_mult: float = documented(4.0, "feed-forward hidden width as a multiple of n_embd", gt=0.0)
    tie_weights: bool = documented(True, "share the output head's weights with the token embedding")
    qkv_bias: bool | None = documented(None, "biases in the Q/K/V projections (null = model.bias)")
    proj_bias: bool | None = documented(None, "bias in attention's output projection W_O (null = model.bias)")
    ffn_bias: bool | None = documented(None, "biases in the feed-forward layers (null = model.bias)")
    head_bias: bool = documented(False, "a bias in the output head's logits (GPT-2 has none)")
    attention: Literal["fused", "explicit"] = documented(
        "fused", "fused: torch's scaled_dot_product_attention kernel; explicit: softmax(QKᵀ/√d_head + mask) V "
        "written out (same results, slower; can return the weights)")


@dataclass
class TrainConfig:
    batch_size: int = documented(32, "windows per micro-batch", ge=1)
    grad_accum: int = documented(1, "micro-batches accumulated per optimizer step", ge=1)
    max_steps: int = documented(5000, "optimizer steps at most (0 = no step limit)", ge=0)
    max_seconds: float = documented(0.0, "wall-clock budget for training in seconds, per invocation (0 = none)", ge=0.0)
    lr: float = documented(1e-3, "peak learning rate of AdamW", gt=0.0)
    min_lr: float = documented(1e-5, "ReduceLROnPlateau never goes below this learning rate", ge=0.0)
    weight_decay: float = documented(0.1, "AdamW weight decay (on the parameters train.decay says)", ge=0.0)
    decay: Literal["matrices", "all"] = documented(
        "matrices", "which parameters weight decay applies to: matrices (not biases, norms; GPT-2) or all (torch's "
        "AdamW used plainly, as the course notebook does)")
    beta1: float = documented(0.9, "AdamW beta1", ge=0.0, lt=1.0)
    beta2: float = documented(0.99, "AdamW beta2", ge=0.0, lt=1.0)
    warmup_steps: int = documented(0, "linear learning-rate warmup from 0 over this many steps", ge=0)
    lr_schedule: Literal["plateau", "cosine", "linear"] = documented(
        "plateau", "after warmup: plateau = ReduceLROnPlateau on validation loss; cosine or linear = decay to min_lr "
        "over the run's budget (max_steps or max_seconds, whichever is nearer)"
    )
    grad_clip: float = documented(1.0, "clip the gradient norm to this value (0 = no clipping)", ge=0.0)
    eval_interval: int = documented(250, "evaluate every this many optimizer steps", ge=1)
    eval_windows: int = documented(128, "windows scored per split at each periodic evaluation", ge=1)
    eval_sampling: Literal["fixed", "random"] = documented(
        "fixed", "fixed: the same windows at every evaluation (a low-noise signal); random: fresh random windows "
        "each time (the course notebook's estimate; seeded by train.seed and the step)")
    eval_at_start: bool = documented(False, "also evaluate before the first step (step 0)")
    plateau_factor: float = documented(0.5, "ReduceLROnPlateau: multiply the lr by this when validation stalls", gt=0.0, lt=1.0)
    plateau_patience: int = documented(3, "ReduceLROnPlateau: evaluations without improvement before lowering the lr", ge=0)
    early_stop_patience: int = documented(0, "stop after this many evaluations without improvement (0 = never)", ge=0)
    seed: int = documented(1337, "seed for Python, torch and the batch sampler", ge=0)
    device: str = documented("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = documented(
        "auto", "autocast dtype: auto = bfloat16 on CUDA where supported, else float16; float32 elsewhere"
    )
    compile: Literal["auto", "true", "false"] = documented("auto", "torch.compile: auto = on CUDA only; true; false")
    loggers: list[Logger] = documented(
        ["jsonl"], "where figures go: jsonl (OUT_DIR/metrics.jsonl, steps.jsonl, summary.json; always on), csv "
        "(OUT_DIR/metrics.csv), tensorboard (OUT_DIR/tensorboard; the tensorboard extra), wandb (the wandb extra; "
        "WANDB_MODE=offline honoured); e.g. --set 'train.loggers=[jsonl,csv]'")
    log_interval: int = documented(50, "log the training loss, lr and tokens/s every this many steps (0 = only "
                                       "with evaluations)", ge=0)
    wandb_project: str = documented("charlm", "the Weights & Biases project of the wandb logger")
    tensorboard: bool = documented(False, "same as adding tensorboard to train.loggers (kept for older configs)")


@dataclass
class SampleConfig:
    temperature: float = documented(0.8, "softmax temperature (0 = greedy)", ge=0.0)
    top_k: int | None = documented(None, "keep only the k most likely characters (null = all)", ge=1)
    top_p: float = documented(1.0, "nucleus sampling: smallest set reaching this probability (1 = all)", gt=0.0, le=1.0)
    max_new_tokens: int = documented(500, "characters to generate", ge=0)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def flat(self) -> dict[str, Any]:
        """Every key as `section.key` -> value."""
        return {f"{section}.{key}": value for section, body in self.to_dict().items() for key, value in body.items()}


SECTIONS: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "sample": SampleConfig}


# ---------------------------------------------------------------------------- finding and reading


def find_config(name_or_path: str) -> Path:
    """A path as given, or the name of a shipped config ("cpu", "tiny.yaml")."""
    path = Path(name_or_path)
    if path.exists():
        return path
    stem = path.name[:-5] if path.name.endswith(".yaml") else path.name
    if path.parent == Path("."):  # a bare name: look among the shipped configs
        for folder in CONFIG_DIRS:
            candidate = folder / f"{stem}.yaml"
            if candidate.is_file():
                return candidate
    shipped = ", ".join(shipped_config_names()) or "none found"
    raise UsageError(f"config file not found: {name_or_path} (shipped configs: {shipped})")


def shipped_config_names() -> list[str]:
    for folder in CONFIG_DIRS:
        if folder.is_dir():
            return sorted(p.stem for p in folder.glob("*.yaml"))
    return []


def read_yaml_file(path: Path) -> dict[str, Any]:
    """Parse a config file with yaml.safe_load (never executed); it must hold a mapping."""
    if path.is_dir():
        raise UsageError(f"config path is a directory, not a YAML file: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
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


# ---------------------------------------------------------------------------- overrides


@dataclass
class Setting:
    """One value for a dotted key, remembering where the user gave it (for error messages)."""

    key: str
    value: Any
    source: str


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
    return Setting(key, _yaml_float(value), f"--set {item}")


def _yaml_float(value: Any) -> Any:
    # YAML 1.1 reads "1e-3" as a string (it wants "1.0e-3"); users mean a number.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in "eE.") or value.strip().lower() in ("inf", "nan") else value
        except ValueError:
            return value
    return value


def file_settings(raw: dict[str, Any], source: str) -> tuple[list[Setting], list[str]]:
    settings, errors = [], []
    for section, body in raw.items():
        if not isinstance(body, dict):
            errors.append(f"{section}: expected a mapping of keys under '{section}:' ({source})")
            continue
        for key, value in body.items():
            settings.append(Setting(f"{section}.{key}", _yaml_float(value), source))
    return settings, errors


# ---------------------------------------------------------------------------- building and validating


def build_config(settings: list[Setting]) -> Config:
    """Apply settings in order over the defaults; raise one UsageError listing every problem."""
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    errors: list[str] = []
    for s in settings:
        problem = _apply(values, s)
        if problem:
            errors.append(problem)
    config = Config(**{name: SECTIONS[name](**values[name]) for name in SECTIONS})
    errors += _check_ranges(config)
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
        return f"unknown section '{section}' in '{s.key}' ({s.source}){_suggest(section, list(SECTIONS))}"
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    if key not in fields:
        return f"unknown key '{s.key}' ({s.source}){_suggest(key, list(fields), prefix=section + '.')}"
    hint = typing.get_type_hints(SECTIONS[section])[key]
    ok, value = _coerce(s.value, hint)
    if not ok:
        return f"{s.key}: expected {_describe(hint)}, got {s.value!r} ({s.source})"
    values[section][key] = value
    return None


def _suggest(word: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid: {', '.join(prefix + o for o in options)}"


def _coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return True, None
        return _coerce(value, next(a for a in args if a is not type(None)))
    if origin is list:
        items = value if isinstance(value, list) else [value]  # `--set train.loggers=csv` means [csv]
        coerced = [_coerce(item, typing.get_args(hint)[0]) for item in items]
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


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(hint) if a is not type(None))
        return f"{_describe(inner)} or null"
    if origin is Literal:
        return "one of " + ", ".join(str(c) for c in typing.get_args(hint))
    if origin is list:
        return f"a list, each {_describe(typing.get_args(hint)[0])}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _check_ranges(config: Config) -> list[str]:
    errors = []
    for section in SECTIONS:
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
    if config.train.max_steps == 0 and config.train.max_seconds == 0:
        errors.append("train.max_steps and train.max_seconds are both 0: set at least one limit")
    if not valid_device_name(config.train.device):
        errors.append(f"train.device: expected {DEVICE_NAMES}, got {config.train.device!r}")
    return errors


DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"


def valid_device_name(name: str) -> bool:
    """The one check of a device name, for train.device and the --device options."""
    return name in ("auto", "cpu", "cuda", "mps") or (name.startswith("cuda:") and name[5:].isdigit())


def _range_problem(value: float, meta: dict[str, Any]) -> str | None:
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


def load_config(path: str | Path | None, sets: list[str] = (), options: Options | None = None) -> Config:
    """The whole precedence chain: defaults < file < --set items < first-class options."""
    settings: list[Setting] = []
    errors: list[str] = []
    if path is not None:
        config_path = find_config(str(path))
        found, errors = file_settings(read_yaml_file(config_path), str(config_path))
        settings += found
    settings += [parse_set(item) for item in sets]
    settings += _option_settings(options or {})
    return _build_reporting_all(settings, errors)


def _build_reporting_all(settings: list[Setting], errors: list[str]) -> Config:
    """build_config, with the problems already found (malformed sections) reported in the same message."""
    try:
        config = build_config(settings)
    except UsageError as e:
        raise_all(errors + (e.details or [str(e)]))
    raise_all(errors)
    return config


def _option_settings(options: Options) -> list[Setting]:
    """First-class CLI options; those not given (None) leave the key alone."""
    return [Setting(key, value, flag) for key, (flag, value) in options.items() if value is not None]


def explicit_settings(sets: list[str], options: Options) -> dict[str, Any]:
    """Only what the user gave on the command line, type- and range-checked (used when resuming)."""
    settings = [parse_set(item) for item in sets] + _option_settings(options)
    config = build_config(settings)
    return {s.key: getattr(getattr(config, s.key.split(".")[0]), s.key.split(".")[1]) for s in settings}


def config_from_dict(raw: dict[str, Any], source: str) -> Config:
    """Rebuild a Config saved in a checkpoint (keys added since then take their defaults); all problems at once."""
    settings, errors = file_settings(raw, source)
    return _build_reporting_all(settings, errors)


@dataclass
class KeyInfo:
    key: str  # section.key
    type: str  # in words: "an integer", "one of cosine, linear"
    default: str  # as YAML writes it
    help: str


def key_reference() -> list[KeyInfo]:
    """Every configuration key with its type, default and meaning (for `charlm config --keys` and docs/config.md)."""
    keys = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            value = f.metadata.get("default", f.default)
            default = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            keys.append(KeyInfo(f"{section}.{f.name}", _describe(hints[f.name]), default, f.metadata["help"]))
    return keys


def reference_markdown() -> str:
    """docs/config.md: every key with its type, default and meaning, generated from the dataclasses."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `charlm/config.py` by `python scripts/gen_config_docs.py`; a test checks it is current.",
        "Set keys in a YAML file (`--config FILE`), with `--set section.key=value`, or with the first-class options",
        "(`--data`, `--device`, `--max-steps`, `--max-seconds`, `--seed`); later sources win in that order.",
        "`charlm config` prints the resolved configuration; `charlm config --keys` prints this table.",
    ]
    section = None
    for k in key_reference():
        if k.key.split(".")[0] != section:
            section = k.key.split(".")[0]
            lines += ["", f"## {section}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        lines.append(f"| `{k.key}` | {k.type} | `{k.default}` | {k.help} |")
    return "\n".join(lines) + "\n"
