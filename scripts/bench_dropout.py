"""What charlm's CPU dropout mask saves: a training step of the `--budget` rule's models with charlm's Dropout and with
torch's nn.Dropout in its place, alternating, and the mask alone.

    python scripts/bench_dropout.py               # the rule's 10-minute and 1-hour models on tiny-shakespeare
    python scripts/bench_dropout.py --steps 3     # a quick check that it runs

Each model is what `charlm train --budget B` trains on tiny-shakespeare (data/tinyshakespeare.txt, `charlm download`):
5 x 128 with dropout 0.1 at 10 minutes, 6 x 160 with dropout 0.2 at an hour. A step is a forward and backward pass
of a batch of the rule's random windows (8 of 256 characters at both budgets); the two kinds of dropout take turns step
by step, and each figure is the median of --steps after two warm-up steps. "mask" times one dropout call on an
activation of the same batch, (8, 256, width), the same way.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from charlm.config.build import load_config
from charlm.config.schema import Config
from charlm.models.decoder import Decoder
from charlm.models.layers import Dropout
from charlm.training.budget import plan_budget

BUDGETS = ("10m", "1h")


def rule_config(budget: str) -> Config:
    """configs/cpu.yaml (tiny-shakespeare) with the keys `charlm train --budget BUDGET` sets on it."""
    base = load_config("cpu")
    if not Path(base.data.path).is_file():
        raise SystemExit(f"{base.data.path} is missing: run `charlm download` first (the rule reads its size)")
    return plan_budget(budget, None, [], {}).config(say=lambda line: None)  # what `charlm train --budget` resolves


def model(config: Config, torch_dropout: bool) -> Decoder:
    """The rule's model, seeded; with `torch_dropout` every charlm Dropout replaced by torch's of the same p."""
    torch.manual_seed(0)
    gpt = Decoder(config.model, 65).train()
    for module in list(gpt.modules()) if torch_dropout else []:
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, nn.Dropout(child.p))
    return gpt


def medians_ms(config: Config, steps: int) -> dict[str, float]:
    """Step and mask times of both kinds of dropout, taking turns, after two warm-up rounds."""
    models = {"charlm": model(config, False), "torch": model(config, True)}
    masks = {"charlm": Dropout(config.model.dropout).train(), "torch": nn.Dropout(config.model.dropout).train()}
    x = torch.randint(0, 65, (config.train.batch_size, config.model.block_size))  # (B, T)
    y = torch.randint(0, 65, x.shape)
    activation = torch.randn(*x.shape, config.model.n_embd)  # (B, T, C)
    times: dict[str, list[float]] = {}
    for round_ in range(steps + 2):
        for kind in ("charlm", "torch"):
            started = time.perf_counter()
            _, loss = models[kind](x, y)
            assert loss is not None
            loss.backward()
            models[kind].zero_grad(set_to_none=True)
            step = time.perf_counter() - started
            started = time.perf_counter()
            masks[kind](activation)
            mask = time.perf_counter() - started
            if round_ >= 2:
                times.setdefault(f"step {kind}", []).append(step)
                times.setdefault(f"mask {kind}", []).append(mask)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="timed rounds after two warm-up ones")
    args = parser.parse_args()
    configs = {budget: rule_config(budget) for budget in BUDGETS}  # a missing corpus is said before any output
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| budget | model | dropout | step ms, charlm's dropout | step ms, torch's | speed-up ", end="")
    print("| mask ms, charlm's | mask ms, torch's |")
    print("|---|---|---|---|---|---|---|---|")
    for budget, config in configs.items():
        ms = medians_ms(config, args.steps)
        m = config.model
        print(
            f"| {budget} | {m.n_layer} x {m.n_embd} | {m.dropout:g} | {ms['step charlm']:.1f} | {ms['step torch']:.1f} "
            f"| {ms['step torch'] / ms['step charlm']:.2f}x | {ms['mask charlm']:.2f} | {ms['mask torch']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
