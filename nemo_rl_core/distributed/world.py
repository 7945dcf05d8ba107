"""This process's place in a stage's torch.distributed world (one rank of a training stage
started by torchrun, or the one process of everything else).

Every rank of a stage runs the same program; rank 0 writes what the stage stores (the
checkpoint, the outputs, the manifest entry) and the others learn its result from it.
"""

import os
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def is_distributed() -> bool:
    """Whether this process is one rank of several."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_writer() -> bool:
    """Whether this process writes the stage's stored results: rank 0, or the only process."""
    return not is_distributed() or dist.get_rank() == 0


def from_writer(value: T) -> T:
    """Rank 0's ``value`` on every rank (a collective); ``value`` itself in one process."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank_device() -> torch.device:
    """The device a rank computes on: its own GPU (``LOCAL_RANK``) under torchrun on a GPU
    machine, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def init_rank(timeout_s: float) -> None:
    """Join the world torchrun set up (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR/PORT``): nccl on
    GPUs, gloo on CPUs; a collective that waits longer than ``timeout_s`` fails."""
    device = rank_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
