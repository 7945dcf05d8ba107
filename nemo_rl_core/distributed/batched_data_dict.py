"""NeMo RL's ``BatchedDataDict``: the one batch type every stage passes around.

A dict whose values are batch-first: tensors with the batch on dim 0, or Python lists
with one entry per sample. Every method keeps all keys aligned on the batch axis.
"""

from collections import UserDict
from collections.abc import Iterator, Sequence
from typing import Any, Generic, Self, TypeVar

import torch

DictT = TypeVar("DictT")


class BatchedDataDict(UserDict, Generic[DictT]):
    """A dict of batch-first tensors and per-sample lists."""

    @classmethod
    def from_batches(
        cls,
        batches: Sequence[dict[str, Any]],
        pad_value_dict: dict[str, int | float] | None = None,
    ) -> Self:
        """Concatenate batches key by key; ragged tensors are right-padded on dim 1.

        ``pad_value_dict`` gives the pad value per key (default 0).
        """
        if not batches:
            return cls()
        pad_value_dict = pad_value_dict or {}
        keys = list(batches[0].keys())
        for i, batch in enumerate(batches[1:], start=1):
            if set(batch.keys()) != set(keys):
                raise ValueError(
                    f"batch {i} has keys {sorted(batch.keys())}, batch 0 has {sorted(keys)}"
                )
        merged = cls()
        for key in keys:
            values = [batch[key] for batch in batches]
            if isinstance(values[0], torch.Tensor):
                merged[key] = _concat_padded(key, values, pad_value_dict.get(key, 0))
            else:
                merged[key] = [item for value in values for item in value]
        return merged

    @property
    def size(self) -> int:
        """Batch size; raises if the keys disagree."""
        sizes = {key: _batch_len(key, value) for key, value in self.data.items()}
        distinct = set(sizes.values())
        if len(distinct) > 1:
            raise ValueError(f"keys have different batch sizes: {sizes}")
        return distinct.pop() if distinct else 0

    def select_indices(self, indices: Sequence[int] | torch.Tensor) -> Self:
        """A new batch with the samples at ``indices``, in that order."""
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        selected = type(self)()
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor):
                selected[key] = value[torch.as_tensor(indices, dtype=torch.long)]
            else:
                selected[key] = [value[i] for i in indices]
        return selected

    def slice(self, start: int, end: int) -> "SlicedDataDict":
        """Samples ``start`` (inclusive) to ``end`` (exclusive)."""
        sliced = SlicedDataDict()
        for key, value in self.data.items():
            sliced[key] = value[start:end]
        return sliced

    def get_batch(self, batch_idx: int, batch_size: int | None = None) -> "SlicedDataDict":
        """The ``batch_idx``-th consecutive chunk of ``batch_size`` samples."""
        if batch_size is None:
            batch_size = self.size
        start = batch_idx * batch_size
        if start >= self.size:
            raise IndexError(f"batch {batch_idx} of size {batch_size} is past size {self.size}")
        return self.slice(start, min(start + batch_size, self.size))

    def repeat_interleave(self, num_repeats: int) -> Self:
        """Repeat each sample ``num_repeats`` times in place (a a b b, not a b a b)."""
        repeated = type(self)()
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor):
                repeated[key] = value.repeat_interleave(num_repeats, dim=0)
            else:
                repeated[key] = [item for item in value for _ in range(num_repeats)]
        return repeated

    def make_microbatch_iterator(self, microbatch_size: int) -> Iterator["SlicedDataDict"]:
        """Consecutive microbatches of ``microbatch_size`` samples (the last may be short)."""
        if microbatch_size <= 0:
            raise ValueError(f"microbatch_size must be positive, got {microbatch_size}")
        for start in range(0, self.size, microbatch_size):
            yield self.slice(start, start + microbatch_size)

    def to(self, device: str | torch.device) -> Self:
        """Move every tensor to ``device`` (lists are left as they are), in place."""
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor):
                self.data[key] = value.to(device)
        return self

    def get_dict(self) -> dict[str, Any]:
        return dict(self.data)


class SlicedDataDict(BatchedDataDict):
    """A contiguous part of a ``BatchedDataDict`` (a shard, a microbatch)."""


def _batch_len(key: str, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise ValueError(f"key {key!r} holds a 0-d tensor; values must be batch-first")
        return value.shape[0]
    if isinstance(value, list | tuple):
        return len(value)
    raise TypeError(f"key {key!r} holds {type(value).__name__}; expected a tensor or a list")


def _concat_padded(key: str, tensors: list[torch.Tensor], pad_value: int | float) -> torch.Tensor:
    dims = {t.dim() for t in tensors}
    if len(dims) != 1:
        raise ValueError(f"key {key!r}: tensors of different ranks {sorted(dims)} cannot be merged")
    if tensors[0].dim() <= 1 or all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
        return torch.cat(tensors, dim=0)
    if any(t.shape[2:] != tensors[0].shape[2:] for t in tensors):
        raise ValueError(f"key {key!r}: tensors differ beyond dim 1 and cannot be padded")
    width = max(t.shape[1] for t in tensors)
    padded = [
        torch.nn.functional.pad(
            t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1]), value=pad_value
        )
        for t in tensors
    ]
    return torch.cat(padded, dim=0)
