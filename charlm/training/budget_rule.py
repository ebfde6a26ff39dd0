"""The budget rule: the model and learning rates a time budget buys on a corpus of some size, from one table (what
`charlm train --budget 10m`, and `charlm train` with no recipe of its own, train).

The rule is one dial, as nanochat has one (its depth sets width, batch and learning rates): the budget sets the depth,
the depth sets the width (24 per layer, rounded up to whole heads of 32; 2 layers keep the default's 96) and the
learning rates (AdamW-sized rates scaled by 1/sqrt(width), nanochat's rule), and the compute per training character sets
the regularisation (how many times the 4 x 96 reference model would go over the training split in the budget): dropout,
kept out of the attention weights (there it costs a CPU the fused attention kernel, and at 10 minutes on
tiny-shakespeare the residual stream's alone did better in the same time), and Muon's weight decay: 0.3 without dropout,
which lowered the 100 s default's loss, 0.1 beside it, which lowered the loss of 10 minutes on tiny-shakespeare on each
of three seeds, and none where the reference would go over the text 1.5 times at most (docs/benchmarks.md, "Recipes for
a time budget" and "Muon's weight decay and 95 s of training for the 3-layer default"). Over 5 minutes the context is
256 instead of 128, the batch halved to keep 2,048 characters a step; a corpus too small to hold a window of it in each
split gets a shorter one. Everything else is configs/cpu.yaml's recipe, which the row for 100 s reproduces exactly.

Where the table comes from is docs/benchmarks.md ("Recipes for a time budget"): the default 3 x 96 recipe is the best
measured at 100 s (2 layers came out level, on a slow day: a slower machine's 100 s gets them), where 4 layers, 5 layers
and 128 wide all did worse (a bigger model sees fewer characters in the time), and 3 layers still beat 4 at 140 s. From
there the depth grows as compute-optimal scaling has it (parameters as the square root of compute; depth x width^2 with
width following depth: depth as compute's sixth root, 4 at 300 s). The rows past 100 s follow that rule;
docs/benchmarks.md says which of them were measured beside what.

The table is read in compute, not seconds: a short probe (charlm/training/probe.py) measures how fast this machine
trains the 4 x 96 reference model, and a budget buys what budget x (that speed / PROBE_REFERENCE_CHARS_PER_S) seconds
buy on the 2-core CPU the table was measured on: a GPU's 100 s picks a deeper row, regularised for the passes it will
make; a slower machine's 10 minutes a shallower one. Beyond the rows measured on a CPU the depth follows the same
sixth root of compute, up to a cap the header says it hit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from charlm.config.schema import Config
from charlm.data.prepare import data_bytes
from charlm.errors import UsageError
from charlm.training.probe import REFERENCE_DEPTH, REFERENCE_WIDTH

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh])\s*$")


@dataclass(frozen=True)
class RuleRow:
    """One line of the table: budgets up to `up_to_s` seconds train a model `depth` layers deep."""

    up_to_s: float
    depth: int
    eval_interval: int  # evaluations cost training time: a longer run needs them less often
    block_size: int  # the context; the batch holds CHARS_PER_STEP characters at every row
    width: int = 0  # 0: width_for(depth)

    @property
    def n_embd(self) -> int:
        return self.width or width_for(self.depth)


# The rule's table (docs/benchmarks.md, "Recipes for a time budget", says where each row comes from).
# Over 5 minutes, a context of 256: the full validation pass scores windows of the context, whose first characters
# see little before them, and at 10 minutes on tiny-shakespeare 256 beat 128 at the same characters a step (at 100 s
# it was no better).
TABLE = (
    # Compute under 80 s of the reference CPU (a machine ~20% slower than it, or one thread of it, at 100 s): 2 layers
    # as wide as the default's, which came out level with 3 on a slow day of that CPU at 100 s (docs/benchmarks.md,
    # "The budget rule's pick for one thread and two"). The probe there measures 22k-31.5k with two threads (above
    # 20.8k, this row's bound at 100 s) and ~19k-20.4k with one.
    RuleRow(80.0, 2, 250, 128, width=96),
    RuleRow(150.0, 3, 250, 128),  # configs/cpu.yaml's model: measured best at 100 s and at 140 s, beside 4 layers
    RuleRow(300.0, 4, 250, 128),
    RuleRow(1200.0, 5, 500, 256),  # from here on, depth = 4 x (budget / 300 s)^(1/6), rounded to these boundaries
    RuleRow(3600.0, 6, 1000, 256),
    RuleRow(9000.0, 7, 1000, 256),
    # Compute a CPU reaches in hours and a GPU in minutes: depth = 4 x (compute / 300 s)^(1/6), rounded, not measured.
    RuleRow(27_600.0, 8, 2000, 256),
    RuleRow(54_000.0, 9, 2000, 256),
    RuleRow(98_000.0, 10, 2000, 256),
    RuleRow(169_000.0, 11, 2000, 256),
    RuleRow(math.inf, 12, 2000, 256),  # the cap: a deeper model needs a recipe measured for it (the header says so)
)
CHARS_PER_STEP = 2048  # configs/cpu.yaml's 16 windows of 128 a forward pass, kept as the context grows (Muon's tuning)
MIN_CONTEXT = 16  # the rule shortens its context for a tiny corpus no further; below it the run says what is wrong
HEAD_SIZE = 32  # configs/cpu.yaml's heads: RoPE needs it even, and fewer, wider heads cost the CPU's attention less
# Characters a second of configs/cpu.yaml's recipe 4 layers deep in a whole run on the 2-core CPU (an AMD EPYC) the
# table was measured on, for the epochs estimates (the regularisation rows below were drawn with it).
REFERENCE_CHARS_PER_S = 31_000.0
# What the speed probe (charlm/training/probe.py: its timed steps alone) measures for that model on that CPU: a
# machine's measured speed over it is how much more compute each second of its budget holds (the median of nine
# probes in fresh processes there; they ranged 20k-31.5k, as noisy as the machine's speed).
PROBE_REFERENCE_CHARS_PER_S = 26_000.0
# Regularisation by the compute the budget holds per training character: how many times that 4 x 96 reference model
# would go over the training split. The rule's model grows with the budget, so the figure counts both how often the
# text comes round and how big a model meets it. Each line: (up to this many, dropout, Muon's weight decay).
# - Up to 1.5 times round, neither: a text seen whole about once has little to learn by heart. (The bound was 2
#   until, at 100 s with one thread, 1.8 by it, the weight decay did better on two seeds of three; an hour on the
#   100 MB kernel slice, 1.1 by it, keeps none.)
# - Up to 15, no dropout (on tiny-shakespeare 2 minutes, 3.5 by it, and 5 minutes, 8.6, did better without; figures
#   under the 7% reserve of then) but Muon's weight decay 0.3: with 95 s of training instead of 93 it lowered the
#   100 s default's median by ~0.01 (~2.9 by it), and 5 minutes' by 0.034 (8.8); 0.1 and 1.0 did no better than none
#   at 100 s's steps. (The bound was 12, between 8.6 and 17; 10 minutes with one thread of the reference CPU, 13,
#   tried both: docs/benchmarks.md, "The budget rule's pick for one thread and two".)
# - Up to 64, dropout 0.1 (10 minutes, 17, did better with it) and Muon's weight decay 0.1: that beat none on each of
#   three seeds at 10 minutes on tiny-shakespeare, and 0.2 was no better.
# - Beyond, dropout 0.2 as nanoGPT's Shakespeare recipe has (an hour, 109). All: docs/benchmarks.md.
REGULARISATION_BY_REFERENCE_EPOCHS = ((1.5, 0.0, 0.0), (15.0, 0.0, 0.3), (64.0, 0.1, 0.1), (math.inf, 0.2, 0.1))
# Start-up and the final validation pass come out of the budget: 5% of it (configs/cpu.yaml's 95 s of 100, where they
# took ~4.5 s on an AMD EPYC, up to ~7 s on an Intel Xeon), at most a minute.
RESERVE_FRACTION, RESERVE_MAX_S = 0.05, 60.0
# The corpus size the rule's keys are checked with before the corpus is at hand (it may yet be downloaded): its shape
# does not depend on it, and a smaller corpus only shortens the context and adds regularisation.
ANY_CORPUS_CHARS = 10**12

# configs/cpu.yaml's recipe apart from what the dial sets; a test checks that the 100 s row gives that file's values.
FIXED = {
    "model.pos_encoding": "rope",
    "model.activation": "swiglu",
    "model.tie_weights": False,
    "model.token_shift": True,
    "train.optimizer": "muon",
    "train.muon_adjust_lr": "match_rms_adamw",
    "train.embed_lr": 2.0e-2,
    "train.min_lr": 1.0e-5,
    "train.lr_schedule": "linear",
    "train.warmup_steps": 100,
    "train.eval_windows": 128,
}
REFERENCE_LR, REFERENCE_HEAD_LR = 5.0e-3, 2.0e-3


def parse_budget(text: str, flag: str = "--budget") -> float:
    """'300s', '10m', '1.5h' -> seconds; anything else is refused in one line."""
    match = _BUDGET.match(text)
    if not match:
        raise UsageError(f"{flag} {text!r} is not a duration: give a number and a unit, e.g. 300s, 10m or 1h")
    seconds = float(match.group(1)) * UNITS[match.group(2)]
    if seconds < 10:
        raise UsageError(f"{flag} {text!r} is too short to train anything: give at least 10s")
    return seconds


def width_for(depth: int) -> int:
    return HEAD_SIZE * math.ceil(3 * depth / 4)


def row_for(seconds: float, speed: float = PROBE_REFERENCE_CHARS_PER_S) -> RuleRow:
    """The row of a budget on a machine training the reference at `speed`: compute, as reference-machine seconds."""
    return next(row for row in TABLE if compute_seconds(seconds, speed) <= row.up_to_s)


def compute_seconds(seconds: float, speed: float = PROBE_REFERENCE_CHARS_PER_S) -> float:
    """What a budget buys on a machine whose probe measured `speed`, as seconds of the reference machine."""
    return seconds * speed / PROBE_REFERENCE_CHARS_PER_S


def training_seconds(seconds: float) -> float:
    """The loop's share of a wall-clock budget (train.max_seconds)."""
    return round(seconds - min(seconds * RESERVE_FRACTION, RESERVE_MAX_S), 1)


def reference_epochs(seconds: float, train_chars: int, speed: float = PROBE_REFERENCE_CHARS_PER_S) -> float:
    """How many times the 4 x 96 reference model would go over a training split of this size in the budget, on a
    machine whose probe measured `speed`."""
    return REFERENCE_CHARS_PER_S * compute_seconds(training_seconds(seconds), speed) / max(train_chars, 1)


def expected_epochs(
    seconds: float, depth: int, width: int, train_chars: int, speed: float = PROBE_REFERENCE_CHARS_PER_S
) -> float:
    """How many times a model this deep and wide would go over its training split in the budget: the reference
    model's speed, scaled by the matrices' work per character (depth x width^2)."""
    return reference_epochs(seconds, train_chars, speed) * REFERENCE_DEPTH * REFERENCE_WIDTH**2 / (depth * width**2)


def _sig2(x: float) -> float:
    return float(f"{x:.2g}")


def recipe_for(
    seconds: float,
    train_chars: int,
    kept: dict[str, Any] | None = None,
    val_chars: int | None = None,
    speed: float = PROBE_REFERENCE_CHARS_PER_S,
    spent: float = 0.0,
) -> dict[str, Any]:
    """Every key the rule sets for this budget and a training split of this many characters, on a machine that
    trains the reference at `speed` characters a second; `kept` holds the user's own keys: model.block_size, for the
    batch to keep CHARS_PER_STEP characters a step. `val_chars`, the validation split's size, shortens the context
    where that split could not hold one window of the row's; `spent`, seconds the probe took, comes out of training."""
    kept = kept or {}
    row = row_for(seconds, speed)
    context = kept.get("model.block_size", context_for(row, min(train_chars, val_chars or train_chars)))
    width = row.n_embd
    scale = math.sqrt(REFERENCE_WIDTH / width)
    dropout, muon_weight_decay = regularisation_for(reference_epochs(seconds, train_chars, speed))
    return {
        **FIXED,
        "model.n_layer": row.depth,
        "model.n_embd": width,
        "model.n_head": width // HEAD_SIZE,
        "model.block_size": context,
        "train.batch_size": max(1, CHARS_PER_STEP // context),
        "model.dropout": dropout,
        "model.attention_dropout": 0.0 if dropout else None,  # None: not set (a config's own, or model.dropout)
        "train.muon_weight_decay": muon_weight_decay,
        "train.lr": _sig2(REFERENCE_LR * scale),
        "train.muon_lr": _sig2(REFERENCE_LR * scale),
        "train.head_lr": _sig2(REFERENCE_HEAD_LR * scale),
        "train.eval_interval": row.eval_interval,
        "train.max_seconds": round(max(training_seconds(seconds) - spent, 1.0), 1),
        "train.max_steps": 0,
    }


def context_for(row: RuleRow, shortest_split: int) -> int:
    """The row's context, halved while the shorter split could not hold one window of it (inputs and the next
    character): a corpus of a few kilobytes still trains, where the row's context would be refused as too long."""
    context = row.block_size
    while context + 1 > shortest_split and context > MIN_CONTEXT:
        context //= 2
    return context


def regularisation_for(epochs_of_reference: float) -> tuple[float, float]:
    """(dropout, Muon's weight decay) for this many epochs of the reference model."""
    return next((p, wd) for limit, p, wd in REGULARISATION_BY_REFERENCE_EPOCHS if epochs_of_reference <= limit)


def split_characters(config: Config) -> tuple[int, int]:
    """The training and validation splits' sizes in characters, estimated from the files' bytes (the same for
    mostly-ASCII text)."""
    total = data_bytes(config.data.path)
    d = config.data
    held_val = 0 if d.val_path else d.val_size or round(total * d.val_fraction)  # a given file takes nothing
    held = held_val + (0 if d.test_path else d.test_size or round(total * d.test_fraction))
    given = Path(d.val_path) if d.val_path else None
    val = given.stat().st_size if given and given.is_file() else held_val  # a missing file is said when it is read
    return max(total - held, 0), val
