"""Multimodal batch items (``nemo_rl.data.multimodal_utils``): tensors of different sizes per
sample (images, audio) kept as one list per batch and concatenated only when a model needs
them."""

from collections.abc import Sequence
from typing import Self

import torch


class PackedTensor:
    """One tensor per sample (or None), packed along ``dim_to_pack`` on demand.

    ``len`` is the number of samples; ``slice`` takes samples; ``as_tensor`` concatenates the
    present ones (None when there is none).
    """

    def __init__(self, tensors: torch.Tensor | list[torch.Tensor | None], dim_to_pack: int):
        assert tensors is not None, "PackedTensor needs tensors, got None"
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        elif not isinstance(tensors, list):
            raise ValueError(f"PackedTensor takes a tensor or a list, got {type(tensors).__name__}")
        assert len(tensors) > 0, "PackedTensor needs a non-empty list of tensors"
        self.tensors: list[torch.Tensor | None] = tensors
        self.dim_to_pack = dim_to_pack

    def __len__(self) -> int:
        return len(self.tensors)

    def as_tensor(self, device: str | torch.device | None = None) -> torch.Tensor | None:
        if device is not None:
            self.to(device)
        present = [t for t in self.tensors if t is not None]
        return torch.cat(present, dim=self.dim_to_pack) if present else None

    def to(self, device: str | torch.device) -> Self:
        self.tensors = [t.to(device) if t is not None else None for t in self.tensors]
        return self

    def slice(self, indices: Sequence[int] | torch.Tensor) -> "PackedTensor":
        chosen = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        if not chosen:
            return PackedTensor([None], self.dim_to_pack)
        return PackedTensor([self.tensors[i] for i in chosen], self.dim_to_pack)

    @classmethod
    def empty_like(cls, other: "PackedTensor") -> "PackedTensor":
        """As many samples as ``other``, none holding a tensor."""
        return cls([None] * len(other), other.dim_to_pack)

    @classmethod
    def concat(cls, packed: list["PackedTensor"]) -> "PackedTensor":
        """The samples of all of ``packed``, in order (one ``dim_to_pack`` for all)."""
        dims = {p.dim_to_pack for p in packed}
        assert len(dims) == 1, f"PackedTensors to concatenate pack along different dims {dims}"
        return cls([t for p in packed for t in p.tensors], dims.pop())

    @classmethod
    def flattened_concat(cls, packed: list["PackedTensor"]) -> "PackedTensor":
        """One sample per input PackedTensor (each packed into one tensor), in order."""
        dims = {p.dim_to_pack for p in packed}
        assert len(dims) == 1, f"PackedTensors to concatenate pack along different dims {dims}"
        return cls([p.as_tensor() for p in packed], dims.pop())
