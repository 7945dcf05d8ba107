"""A dataloader whose position is a small dict, saved with every checkpoint.

The order of epoch ``e`` is a permutation drawn from ``seed + e`` alone, so the state
``{epoch, position, seed, ...}`` is enough to resume at exactly the next sample an
uninterrupted run would have seen, in a new process, on another machine.
"""

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from nemo_rl_core.data.datasets.processed_dataset import rl_collate_fn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

_CHECKED_KEYS = ("dataset_size", "batch_size", "seed", "shuffle", "drop_last")


class MapStyleDataset(Protocol):
    """What the loader reads: a length and samples by index (torch's map-style dataset)."""

    def __len__(self) -> int: ...

    def __getitem__(self, idx: int, /) -> Any: ...


class StatefulDataLoader:
    """Batches of ``batch_size`` samples, epoch after epoch; ``state_dict`` marks the next one."""

    def __init__(
        self,
        dataset: MapStyleDataset,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 42,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], BatchedDataDict] = rl_collate_fn,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) < (batch_size if drop_last else 1):
            raise ValueError(
                f"dataset has {len(dataset)} samples, fewer than one batch of {batch_size} "
                "(lower the batch size or add data)"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.epoch = 0
        self.position = 0  # samples of this epoch already handed out
        self._order_epoch: int | None = None
        self._order: list[int] = []

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_order(self, epoch: int) -> list[int]:
        """Sample indices of ``epoch`` in the order they are served."""
        if self._order_epoch != epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                self._order = torch.randperm(len(self.dataset), generator=generator).tolist()
            else:
                self._order = list(range(len(self.dataset)))
            self._order_epoch = epoch
        return self._order

    def _epoch_done(self) -> bool:
        usable = len(self) * self.batch_size if self.drop_last else len(self.dataset)
        return self.position >= usable

    def next_batch(self) -> BatchedDataDict:
        """The next batch, starting a new epoch when this one is used up."""
        if self._epoch_done():
            self.epoch, self.position = self.epoch + 1, 0
        indices = self.epoch_order(self.epoch)[self.position : self.position + self.batch_size]
        self.position += len(indices)
        return self.collate_fn([self.dataset[i] for i in indices])

    def __iter__(self) -> Iterator[BatchedDataDict]:
        """The remaining batches of the current epoch (NeMo RL's ``for batch in dataloader``);
        a finished epoch rolls over to the next one first."""
        if self._epoch_done():
            self.epoch, self.position = self.epoch + 1, 0
        while not self._epoch_done():
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "dataset_size": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state``; refuses a state saved for a different dataset or order."""
        current = self.state_dict()
        for key in _CHECKED_KEYS:
            if key in state and state[key] != current[key]:
                raise ValueError(
                    f"dataloader state has {key}={state[key]!r} but this dataloader has "
                    f"{key}={current[key]!r}; resume with the data config the state was saved with"
                )
        for key in ("epoch", "position"):
            if key not in state:
                raise KeyError(f"dataloader state has no {key!r} (keys: {sorted(state)})")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
