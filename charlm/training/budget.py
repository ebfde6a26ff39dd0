"""Budgets as a run asks for them: `--budget 10m` checked against the command's other settings, the speed given or
measured, and the recipe the rule (charlm/training/budget_rule.py) picks for it once the corpus is at hand; and the
default run, which is the rule at DEFAULT_BUDGET.

Keys the user sets (with --set, a first-class option, or in a --config file other than the default's) win, and the
header line says which were kept. The budget owns train.max_seconds (refused beside an explicit one) and turns the
step limit off unless the command line gives one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from charlm.config import schema as cfg
from charlm.config.build import load_config
from charlm.config.schema import Config
from charlm.data.download import ensure_builtin_corpus
from charlm.errors import UsageError
from charlm.families.registry import family, family_for
from charlm.training.budget_rule import (
    ANY_CORPUS_CHARS,
    FIXED,
    PROBE_REFERENCE_CHARS_PER_S,
    compute_seconds,
    expected_epochs,
    parse_budget,
    recipe_for,
    reference_epochs,
    row_for,
    split_characters,
)
from charlm.training.probe import MOST_PROBE_SECONDS, REFERENCE_DEPTH, REFERENCE_WIDTH, Speed, measure_speed

# `charlm train` with no config file and no limit of its own trains the rule's pick for this budget on the machine in
# front of it: on the 2-core CPU the rule was measured on, configs/cpu.yaml's recipe (its 100 s); on a GPU, what the
# GPU trains in 100 s.
DEFAULT_BUDGET = "100s"
LIMIT_KEYS = ("train.max_seconds", "train.max_steps")


def default_budget(
    config_file: str | None, sets: list[str], options: cfg.Options, fresh: bool, speed: Callable[[], Speed | None]
) -> str | None:
    """DEFAULT_BUDGET for a fresh run (no resume, no source model) of a decoder on running text that names no config
    file and no limit; else None: the default config's own recipe and limits. Under torchrun without a speed given
    (`speed()`: the flag's or CHARLM_SPEED's, read only here), None too: each process would measure its own speed
    and could pick another model."""
    if config_file is not None or not fresh:
        return None
    given = {cfg.parse_set(item).key for item in sets} | {k for k, (_, v) in options.items() if v is not None}
    if given & set(LIMIT_KEYS) or (int(os.environ.get("WORLD_SIZE", "1")) > 1 and speed() is None):
        return None
    try:
        decoder = family_for(load_config(cfg.DEFAULT_CONFIG, sets, options)) is family("decoder")
    except UsageError:  # a setting that only the rule's pick makes valid, or a mistake plan_budget will name
        decoder = True
    return DEFAULT_BUDGET if decoder else None


@dataclass
class BudgetRequest:
    """A --budget resolved as far as it can be before the run: parsed, checked against the other settings. The recipe
    itself waits for the corpus (a built-in one is downloaded first), in `config`."""

    text: str
    seconds: float
    config_file: str | None
    sets: list[str]
    options: cfg.Options
    user_keys: dict[str, str] = field(default_factory=dict)  # key -> where the user gave it
    speed: Speed | None = None  # given (--speed, CHARLM_SPEED), else measured when the run starts

    def config(self, say: Callable[[str], None]) -> Config:
        """The run's configuration: the rule's keys where the user gave none, for the speed given or measured here;
        says the speed and what was chosen, a line each."""
        base = _check_with_rule(self.text, self.seconds, self.config_file, self.sets, self.options, self.user_keys)
        ensure_builtin_corpus(base.data.path, say)
        chars, val_chars = split_characters(base)
        kept = {k: v for k, v in base.flat().items() if k in self.user_keys}
        self.speed = self.speed or measure_speed(base, say)
        speed = self.speed.chars_per_s
        # the user's keys beside the row this speed picks (plan_budget checked them beside the reference speed's)
        _check_with_rule(self.text, self.seconds, self.config_file, self.sets, self.options, self.user_keys, speed)
        say(f"{self.speed.words()}: {self.text} here buys what {_duration(compute_seconds(self.seconds, speed))} buys "
            "on the 2-core CPU the rule was measured on")  # fmt: skip
        recipe = recipe_for(self.seconds, chars, kept, val_chars, speed, self.speed.seconds)
        theirs = set(self.user_keys)
        if "model.dropout" in theirs:  # a dropout of the user's own keeps its own reach
            theirs.add("model.attention_dropout")
        chosen = {k: v for k, v in recipe.items() if k not in theirs}
        options = {**self.options, **{k: ("--budget", v) for k, v in chosen.items()}}
        config = load_config(self.config_file or cfg.DEFAULT_CONFIG, self.sets, options)
        say(self.describe(config, (chars, val_chars), sorted(k for k in recipe if k in self.user_keys)))
        return config

    def record(self) -> dict[str, Any]:
        """budget.json in the run folder: the budget, the speed it was read with and what that bought."""
        speed = self.speed.chars_per_s if self.speed else PROBE_REFERENCE_CHARS_PER_S
        row = row_for(self.seconds, speed)
        return {
            "budget": self.text,
            "seconds": self.seconds,
            "speed": self.speed.as_dict() if self.speed else None,
            "reference_chars_per_s": PROBE_REFERENCE_CHARS_PER_S,
            "compute_seconds": compute_seconds(self.seconds, speed),
            "depth": row.depth,
            "capped": math.isinf(row.up_to_s),
        }

    def describe(self, config: Config, splits: tuple[int, int], kept: list[str]) -> str:
        m, t = config.model, config.train
        speed = self.speed.chars_per_s if self.speed else PROBE_REFERENCE_CHARS_PER_S
        chars, row = splits[0], row_for(self.seconds, speed)
        epochs = expected_epochs(self.seconds, m.n_layer, m.n_embd, chars, speed)
        reference = reference_epochs(self.seconds, chars, speed)
        limit = (
            "the table's deepest row, its cap: a deeper model wants a recipe measured for it"
            if math.isinf(row.up_to_s)
            else f"budgets up to {_duration(row.up_to_s)} of the reference CPU"
        )
        mine = config.flat()
        yours = "; yours kept: " + ", ".join(f"{k}={mine[k]}" for k in kept) if kept else ""
        layers = f"{m.n_layer} layer{'s' if m.n_layer > 1 else ''}"
        outside = " outside attention" if m.dropout and m.attention_dropout == 0 else ""
        context = f"context {m.block_size}"
        if "model.block_size" not in kept and m.block_size < row.block_size:  # context_for shortened it
            split = "validation" if splits[1] <= splits[0] else "training"
            context += f" (the {min(splits):,}-character {split} split holds no window of {row.block_size})"
        decay = f", Muon weight decay {t.muon_weight_decay:g}" if t.muon_weight_decay and t.optimizer == "muon" else ""
        return (
            f"budget {self.text}: {t.max_seconds:g} s of training; for {limit} (charlm/training/budget_rule.py) "
            f"{layers} x {m.n_embd} wide, {m.n_head} heads, {context} x batch {t.batch_size}, dropout "
            f"{m.dropout:g}{outside}{decay} (~{epochs:.0f} epochs of {chars:,} training characters; regularisation by "
            f"the {REFERENCE_DEPTH} x {REFERENCE_WIDTH} reference's ~{reference:.0f}), "
            f"lr {t.lr:.2g}, evaluations every {t.eval_interval} steps{yours}"
        )


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 7200:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.3g} min" if seconds >= 120 else f"{seconds:.3g} s"


def plan_budget(
    text: str, config_file: str | None, sets: list[str], options: cfg.Options, speed: Speed | None = None
) -> BudgetRequest:
    """Check a --budget against the command's other settings (one line for each mistake) before anything runs; a
    `speed` given spares the probe."""
    seconds = parse_budget(text)
    if speed is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError(
            "--budget under torchrun needs --speed: each process would measure its own and could pick another "
            "recipe; run it once in one process (its first line says the speed), then give that figure"
        )
    if speed is None and seconds < MOST_PROBE_SECONDS * 3:
        raise UsageError(
            f"--budget {text} leaves no room to measure this machine's speed (the probe takes up to "
            f"{MOST_PROBE_SECONDS:g} s): give at least {MOST_PROBE_SECONDS * 3:g}s, or the speed with --speed"
        )
    user_keys = {s.key: s.source for s in map(cfg.parse_set, sets)}
    user_keys |= {key: flag for key, (flag, value) in options.items() if value is not None}
    if "train.max_seconds" in user_keys:
        raise UsageError(
            f"--budget {text} sets train.max_seconds, and {user_keys['train.max_seconds']} gives it too; keep one"
        )
    # A config the user chose: its keys, and those of the configs it builds on, are theirs, but for the limits the
    # budget owns. The default recipe's are not: the rule's 100 s row is that recipe, so naming it (--config cpu) or
    # building on it changes only what the user's own files set.
    if config_file is not None:
        recipe = cfg.shown_path(cfg.find_config(cfg.DEFAULT_CONFIG))
        for s in cfg.chain_settings(config_file, cfg.DEFAULT_CONFIG, cfg.SECTION_KEYS)[0]:
            if s.source != recipe and s.key not in ("train.max_seconds", "train.max_steps"):
                user_keys.setdefault(s.key, s.source)
    base = _check_with_rule(text, seconds, config_file, sets, options, user_keys)
    run_family = family_for(base)
    if run_family is not family("decoder"):  # the lines family is a decoder too, on other batches
        raise UsageError(
            f"--budget picks the recipe of a decoder on running text, not of {run_family.noun or 'this run'}; for "
            "this run set train.max_seconds yourself"
        )
    return BudgetRequest(text, seconds, config_file, list(sets), dict(options), user_keys, speed)


def _check_with_rule(
    text: str,
    seconds: float,
    config_file: str | None,
    sets: list[str],
    options: cfg.Options,
    user_keys: dict,
    speed: float = PROBE_REFERENCE_CHARS_PER_S,
) -> Config:
    """The user's settings checked beside the rule's (its shape for the budget, as for a corpus of any size), not the
    default config's: 128 wide goes with the rule's 4 heads at 10 minutes. A key of the rule's that a problem names
    is said, so that the user knows what to set beside their own."""
    rule = {k: v for k, v in recipe_for(seconds, ANY_CORPUS_CHARS, speed=speed).items() if k not in user_keys}
    with_rule = {**options, **{k: ("--budget", v) for k, v in rule.items()}}
    try:
        return load_config(config_file or cfg.DEFAULT_CONFIG, sets, with_rule)  # every other mistake as usual
    except UsageError as e:
        problems = [p for p in e.details or [str(e)] if not p.startswith("unknown ")]  # a typo's, not the rule's
        shape = [k for k in rule if k not in FIXED and rule[k] is not None]  # FIXED: the default config's own
        named = [k for k in shape if any(re.search(rf"\b{k.split('.')[1]}\b", p) for p in problems)]
        if not named:
            raise
        chose = ", ".join(f"{k}={rule[k]}" for k in named)
        rule_name = f"--budget {text}" if config_file is not None or text != DEFAULT_BUDGET else "the budget rule"
        hint = f"{rule_name} chose {chose}: set {'it' if len(named) == 1 else 'them'} too with --set"
        message = str(e).removesuffix(":")
        raise UsageError(f"{message} ({hint}){':' if e.details else ''}", details=e.details) from None
