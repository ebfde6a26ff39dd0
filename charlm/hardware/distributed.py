"""torch.distributed for multi-process training under torchrun: nccl on CUDA (one GPU per local rank), gloo on CPU.

A single process without torchrun gets a Dist of world size 1 whose collectives do nothing, so the training loop
reads the same either way.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from charlm.errors import UsageError


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    active: bool = False  # a process group exists (under torchrun, even with one process)
    owns_group: bool = False  # setup() created it, so teardown() ends it; a caller's own group outlives the run

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        """The process group's backend (nccl, gloo), or "none" for a single process."""
        return str(dist.get_backend()) if self.active else "none"

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks (identity for one process)."""
        if self.active:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place maximum over ranks (identity for one process)."""
        if self.active:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order (for the checkpoint's per-rank RNG and sampler states)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def setup(device_name: str) -> tuple[Dist, str]:
    """Join the process group torchrun describes; returns it and the device name this rank should use."""
    if not under_torchrun():
        return Dist(), device_name
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
            raise UsageError(
                f"rank {rank} needs CUDA device {local_rank}, but this machine has "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}; lower --nproc_per_node"
            )
        torch.cuda.set_device(local_rank)
        device_name = f"cuda:{local_rank}"
    elif device_name == "auto":
        device_name = "cpu"
    backend = "nccl" if use_cuda else "gloo"
    # A script that runs several trainings under one torchrun launch joins the group once, before the first: each run
    # uses it and leaves it to its owner (a destroyed group cannot be rejoined reliably under the same launch).
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=10))
    return Dist(rank, world, local_rank, active=True, owns_group=owns_group), device_name


def teardown(d: Dist) -> None:
    if d.owns_group and dist.is_initialized():
        dist.destroy_process_group()
