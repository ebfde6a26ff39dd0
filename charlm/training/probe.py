"""How fast this machine trains: a few seconds of the budget rule's reference model's training steps on the run's
device, precision, threads and linear kernels, in characters a second — what `--budget` turns seconds into compute
with. A speed can be given instead (`--speed`, or CHARLM_SPEED), for tests and for users who know theirs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from charlm.config import schema as cfg
from charlm.config.build import load_config
from charlm.config.schema import Config
from charlm.errors import UsageError
from charlm.families.registry import build_model
from charlm.hardware.device import autocast, out_of_memory, pick_device, precision_name
from charlm.models.linear import onednn_linears, use_onednn
from charlm.training.optim import make_optimizer
from charlm.training.setup import training_dtype

SPEED_ENV = "CHARLM_SPEED"
# The reference the rule's table and regularisation were measured with: configs/cpu.yaml's recipe 4 layers deep (its
# width the one whose learning rates that recipe tuned), its heads of 32, its 16 windows of 128 a step.
REFERENCE_DEPTH, REFERENCE_WIDTH, REFERENCE_CONTEXT, REFERENCE_BATCH = 4, 96, 128, 16
REFERENCE_SETS = [
    f"model.n_layer={REFERENCE_DEPTH}",
    f"model.n_head={REFERENCE_WIDTH // 32}",
    f"model.n_embd={REFERENCE_WIDTH}",
    f"model.block_size={REFERENCE_CONTEXT}",
]
PROBE_VOCAB = 65  # tiny-shakespeare's: the speed hardly depends on it at this width
WARMUP_STEPS = 3  # the first steps pay for allocations and kernel choice
TIMED_SECONDS, MIN_TIMED_STEPS = 2.0, 5
MOST_PROBE_SECONDS = 10.0  # what a probe may take at most on a slow machine: budgets must leave room for it


@dataclass(frozen=True)
class Speed:
    """Characters a second the reference model trains at here, and where the figure came from."""

    chars_per_s: float
    source: str  # "measured", "--speed" or CHARLM_SPEED
    setting: str = ""  # what was measured: "cpu, float32, 2 threads"
    seconds: float = 0.0  # what measuring took, out of the budget
    note: str = ""  # a smaller probe taken after one ran out of memory

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def words(self) -> str:
        """The header's account: '26k chars/s for the 4 x 96 reference here (measured in 2.4 s: cpu, ...)'."""
        how = f"measured in {self.seconds:.1f} s: {self.setting}" if self.source == "measured" else self.source
        note = f"; {self.note}" if self.note else ""
        shape = f"{REFERENCE_DEPTH} x {REFERENCE_WIDTH}"
        return f"{rate(self.chars_per_s)} chars/s for the {shape} reference here ({how}{note})"


def rate(chars_per_s: float) -> str:
    """31k, 1.3M: a speed as --speed takes it."""
    return f"{chars_per_s / 1e6:.3g}M" if chars_per_s >= 1e6 else f"{chars_per_s / 1e3:.3g}k"


def parse_speed(text: str, source: str) -> float:
    """A given speed: characters a second, a positive number ('26000', '26k', '1.3M'); anything else one line."""
    scale = {"k": 1e3, "m": 1e6}.get(text.strip()[-1:].lower(), 1.0)
    number = text.strip()[:-1] if scale != 1.0 else text.strip()
    try:
        value = float(number) * scale
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise UsageError(
            f"{source} {text!r} is not a speed: give the reference model's training characters a second as a "
            "positive number, e.g. 26000 or 26k"
        )
    return value


def given_speed(flag: str | None) -> Speed | None:
    """The speed the command line (or else the environment) gives, checked; None: measure it."""
    if flag is not None:
        return Speed(parse_speed(flag, "--speed"), "--speed")
    from_env = os.environ.get(SPEED_ENV)
    if from_env is not None and from_env.strip():
        return Speed(parse_speed(from_env, SPEED_ENV), SPEED_ENV)
    return None


def reference_config(run: Config, batch_size: int) -> Config:
    """The reference model's recipe on the run's device, precision and linear kernels."""
    t = run.train
    sets = [*REFERENCE_SETS, f"train.batch_size={batch_size}", f"train.device={t.device}"]
    sets += [f"train.dtype={t.dtype}", f"train.cpu_linear={t.cpu_linear}"]
    return load_config(cfg.DEFAULT_CONFIG, sets)


def measure_speed(run: Config, say: Callable[[str], None]) -> Speed:
    """Time the reference model's training steps here; a probe that runs out of memory is taken again at half the
    batch, and said. Eager always: compiling would take longer than the probe (a compiled run is faster still)."""
    started, batch, note = time.perf_counter(), REFERENCE_BATCH, ""
    while True:
        try:
            chars_per_s, setting = _timed_steps(reference_config(run, batch), started)
            return Speed(chars_per_s, "measured", setting, time.perf_counter() - started, note)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            if not out_of_memory(e) or batch == 1:
                raise
            say(f"speed probe: batch {batch} ran out of memory, trying batch {batch // 2}")
            note = f"batch {REFERENCE_BATCH} ran out of memory, measured at batch {batch // 2}"
            batch //= 2
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _timed_steps(config: Config, started: float) -> tuple[float, str]:
    """(characters a second over the timed steps, the setting in words); the probe ends MOST_PROBE_SECONDS after
    `started` at the latest, after one timed step at least."""
    device = pick_device(config.train.device)
    model = build_model(config.model, PROBE_VOCAB).to(device)
    optimizer = make_optimizer(model, config.train, device)
    dtype = training_dtype(config, device)
    b, t = config.train.batch_size, config.model.block_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(PROBE_VOCAB, (b, t + 1), generator=generator).to(device)
    x, y = ids[:, :-1], ids[:, 1:]  # (B, T) each

    def step() -> None:
        with autocast(device, dtype):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    onednn = use_onednn(device, config.train.cpu_linear) and dtype is None
    with onednn_linears(onednn):
        for warm in range(WARMUP_STEPS):  # fewer when a slow machine's first step already ate into the probe
            step()
            _sync(device)
            if time.perf_counter() - started > MOST_PROBE_SECONDS - TIMED_SECONDS and warm:
                break
        steps, begun = 0, time.perf_counter()
        while steps == 0 or (
            (steps < MIN_TIMED_STEPS or time.perf_counter() - begun < TIMED_SECONDS)
            and time.perf_counter() - started < MOST_PROBE_SECONDS
        ):
            step()
            steps += 1
            if steps % 5 == 0:
                _sync(device)
        _sync(device)
        seconds = time.perf_counter() - begun
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    return steps * b * t / seconds, f"{device.type}, {precision_name(dtype)}{threads}"


def _sync(device: torch.device) -> None:
    """Wait for the device's queued work: a GPU's steps return before they are done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
