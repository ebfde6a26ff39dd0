"""One optimizer step: the micro-batches (gradient accumulation, DDP's all-reduce on the last only), a check that
the loss is finite before any weight is touched, clipping, the (scaled) step, and zeroed gradients."""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch
from torch import nn

from charlm.config.schema import Config
from charlm.errors import WorkError
from charlm.families.base import Batches
from charlm.hardware.device import autocast
from charlm.hardware.distributed import Dist
from charlm.training.averaging import WeightAverage
from charlm.training.optim import Optimizers


class OptimizerStep:
    """Owns what a step touches; the Trainer passes the forward to call (compiled or not) and the step's lr."""

    def __init__(
        self,
        config: Config,
        model: nn.Module,
        uncompiled: nn.Module,
        batches: Batches,
        optimizer: Optimizers,
        scaler: Any,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        dist: Dist,
        average: WeightAverage | None = None,
    ):
        self.train, self.model, self.uncompiled, self.batches = config.train, model, uncompiled, batches
        self.optimizer, self.scaler, self.device, self.amp_dtype, self.dist = optimizer, scaler, device, amp_dtype, dist
        self.average = average  # train.ema_decay: the weights' running average, updated after every step

    def step(self, forward: nn.Module, lr: float, step: int) -> tuple[torch.Tensor, int]:
        """(the mean loss over the micro-batches, this rank's tokens) of step `step` + 1, taken at learning rate lr."""
        tc = self.train
        self.optimizer.set_lr(lr)
        loss_sum = torch.zeros((), device=self.device)
        tokens = 0
        for micro in range(tc.grad_accum):
            x, y = self.batches.next_batch()  # text: windows (B, T); pairs: (sources, BOS + targets)
            inputs = x if isinstance(x, tuple) else (x,)
            tokens += self.batches.last_tokens
            sync = not self.dist.active or micro == tc.grad_accum - 1  # DDP all-reduces on the last micro-step only
            with (
                contextlib.nullcontext()
                if sync
                else cast(nn.parallel.DistributedDataParallel, self.uncompiled).no_sync()
            ):
                with autocast(self.device, self.amp_dtype):
                    _, loss = forward(*inputs, y)
                loss = loss / tc.grad_accum
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        if self.dist.active:  # every rank sees the same mean loss, so all stop together if it is not finite
            self.dist.sum_(loss_sum).div_(self.dist.world_size)
        if not torch.isfinite(loss_sum):  # stop before the optimizer step, so no weight is touched
            raise WorkError(
                f"loss became {loss_sum.item()} at step {step + 1}; training stopped before "
                "updating the weights, the last checkpoints are untouched (try a lower train.lr or train.grad_clip)"
            )
        optimizers = self.optimizer.optimizers
        if tc.grad_clip:
            if self.scaler:
                for opt in optimizers:
                    self.scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
        if self.scaler:
            for opt in optimizers:
                self.scaler.step(opt)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average is not None:
            self.average.update()
        return loss_sum, tokens
