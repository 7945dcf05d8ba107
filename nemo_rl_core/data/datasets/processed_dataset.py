"""Rows -> DatumSpecs on access, and a batch of DatumSpecs -> one ``BatchedDataDict``.

NeMo RL's ``AllTaskProcessedDataset`` and ``rl_collate_fn``: each row is processed by its
task's processor (``task_name`` column, else the default task) when it is read, so a large
dataset costs no tokenization up front.
"""

from collections.abc import Sequence
from typing import Any

import torch

from nemo_rl_core.data.interfaces import DatumSpec, TaskDataProcessFnCallable, TaskDataSpec
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class AllTaskProcessedDataset:
    """A map-style dataset of ``DatumSpec``s over rows of one or more tasks."""

    def __init__(
        self,
        dataset: Sequence[dict[str, Any]],
        tokenizer: Any,
        default_task_data_spec: TaskDataSpec,
        task_data_processors: dict[str, tuple[TaskDataSpec, TaskDataProcessFnCallable]]
        | TaskDataProcessFnCallable,
        max_seq_length: int,
    ):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.default_task_data_spec = default_task_data_spec
        self.task_data_processors = task_data_processors
        self.max_seq_length = max_seq_length
        if isinstance(task_data_processors, dict):
            for spec, _ in task_data_processors.values():
                spec.copy_defaults(default_task_data_spec)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> DatumSpec:
        row = self.dataset[idx]
        if callable(self.task_data_processors):
            spec, processor = self.default_task_data_spec, self.task_data_processors
        else:
            task = row.get("task_name") or self.default_task_data_spec.task_name
            if task not in self.task_data_processors:
                raise KeyError(
                    f"row {idx} has task_name {task!r}; processors exist for "
                    f"{sorted(self.task_data_processors)}"
                )
            spec, processor = self.task_data_processors[task]
        return processor(row, spec, self.tokenizer, self.max_seq_length, idx)


def rl_collate_fn(data_batch: list[DatumSpec]) -> BatchedDataDict[DatumSpec]:
    """Stack DatumSpecs into the batch a rollout takes (message logs stay per-sample lists)."""
    batch: BatchedDataDict[DatumSpec] = BatchedDataDict(
        {
            "message_log": [d["message_log"] for d in data_batch],
            "length": torch.tensor([d["length"] for d in data_batch], dtype=torch.long),
            "loss_multiplier": torch.tensor(
                [d["loss_multiplier"] for d in data_batch], dtype=torch.float32
            ),
            "extra_env_info": [d["extra_env_info"] for d in data_batch],
            "task_name": [d.get("task_name") for d in data_batch],
            "idx": [d["idx"] for d in data_batch],
        }
    )
    if any("stop_strings" in d for d in data_batch):
        batch["stop_strings"] = [d.get("stop_strings") for d in data_batch]
    return batch
