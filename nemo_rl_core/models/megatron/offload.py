"""A Megatron rank's memory parked in host memory between steps, as NeMo RL's Megatron
workers offload before and after a refit.

Megatron's tensors are views: parameters and their gradients live inside the contiguous
buffers of its ``DistributedDataParallel``, and the distributed optimizer's shards are
views of those again. So nothing is replaced: each underlying storage is emptied in place
(resized to nothing, as megatron-core's own ``offload_to_cpu`` does) after its bytes are
copied to a host buffer, and refilled from it, so every view sees its values again. Unlike
``offload_to_cpu`` (pinned copies only, which need CUDA) the same code frees and restores
host storages too, so the tests here check on CPU the values that come back.
"""

from collections.abc import Sequence

import torch


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over the whole of ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def in_device_memory(storage: torch.UntypedStorage) -> bool:
    """Whether parking ``storage`` frees device memory. Host storages stay where they are
    (without CUDA every park is a no-op, as the HF policy's offload is); the tests here
    park host storages in their place to check what comes back."""
    return storage.device.type != "cpu"


def distinct_storages(
    tensors: Sequence[torch.Tensor], besides: Sequence[torch.UntypedStorage] = ()
) -> list[torch.UntypedStorage]:
    """The device storages under ``tensors``, each once, leaving out those in ``besides``."""
    seen = {storage.data_ptr() for storage in besides}
    storages = []
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes() and in_device_memory(storage) and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            storages.append(storage)
    return storages


class ParkedStorages:
    """Storages that can leave device memory and come back with their values (or, with
    ``keep_values`` false, as zeros: gradient buffers a step refills). The host buffers are
    allocated once (pinned where CUDA is) and reused while the storages keep their sizes."""

    def __init__(self, keep_values: bool) -> None:
        self.keep_values = keep_values
        self.parked: list[tuple[torch.UntypedStorage, int]] = []
        self._host: list[torch.Tensor] = []

    @property
    def is_parked(self) -> bool:
        return bool(self.parked)

    def park(self, storages: list[torch.UntypedStorage]) -> None:
        """Empty ``storages`` in place, their bytes first copied to host memory (the
        caller gives the freed device memory back: ``release_device_memory``)."""
        if self.parked:
            return
        sizes = [storage.nbytes() for storage in storages]
        if self.keep_values:
            if [host.numel() for host in self._host] != sizes:
                pin = torch.cuda.is_available()
                self._host = [
                    torch.empty(size, dtype=torch.uint8, pin_memory=pin) for size in sizes
                ]
            for storage, host in zip(storages, self._host, strict=True):
                host.copy_(_as_bytes(storage))
        for storage in storages:
            storage.resize_(0)
        self.parked = list(zip(storages, sizes, strict=True))

    def restore(self) -> None:
        """Refill the parked storages: their values, or zeros."""
        for index, (storage, size) in enumerate(self.parked):
            storage.resize_(size)
            if self.keep_values:
                _as_bytes(storage).copy_(self._host[index])
            else:
                _as_bytes(storage).zero_()
        self.parked = []
