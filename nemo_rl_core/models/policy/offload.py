"""Moving a trained model and its optimizer state out of GPU memory and back.

A policy colocated with its generation engine (``policy.generation.colocated.enabled``)
gives the GPU to the engine between steps, as NeMo RL's colocated workers do: the optimizer
state leaves before a refit, the weights after it, and both come back before the next
logprob or training pass. On a machine without CUDA everything already sits in host memory
and every move is a no-op.
"""

import gc
from typing import Protocol, runtime_checkable

import torch

HOST = torch.device("cpu")


@runtime_checkable
class Offloadable(Protocol):
    """A trained model that can leave device memory between passes (the HF trainer, the
    Megatron ranks); its next logprob or training pass brings it back."""

    def offload(self, weights: bool) -> None: ...


def move_module(module: torch.nn.Module, device: torch.device) -> None:
    """``module``'s parameters and buffers onto ``device``, in place. FSDP2-sharded modules
    do not move their buffers with ``Module.to``, so buffers are swapped one by one first."""
    for buffer in module.buffers():
        if buffer.device != device:
            torch.utils.swap_tensors(buffer, buffer.to(device))
    module.to(device)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Every tensor of ``optimizer``'s per-parameter state (Adam's moments; its step count
    stays where it is, as torch keeps it on the host) onto ``device``."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step" and value.device != device:
                state[key] = value.to(device)


def release_device_memory() -> None:
    """Give the CUDA caching allocator's freed blocks back, so another process (the
    generation engine) can take them."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
