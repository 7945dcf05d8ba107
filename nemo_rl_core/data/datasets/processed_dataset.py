"""Rows -> DatumSpecs on access, and a batch of DatumSpecs -> one ``BatchedDataDict``.

NeMo RL's ``AllTaskProcessedDataset``, ``rl_collate_fn`` and ``preference_collate_fn``: each row is processed by its
task's processor (``task_name`` column, else the default task) when it is read, so a large
dataset costs no tokenization up front.
"""

from collections.abc import Sequence
from typing import Any

import torch

from nemo_rl_core.data.interfaces import (
    DatumSpec,
    PreferenceDatumSpec,
    TaskDataProcessFnCallable,
    TaskDataSpec,
)
from nemo_rl_core.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    batched_message_log_to_flat_message,
)
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

    def __getitem__(self, idx: int) -> DatumSpec | PreferenceDatumSpec:
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


def preference_collate_fn(
    data_batch: list[PreferenceDatumSpec], tokenizer: Any, make_sequence_length_divisible_by: int
) -> BatchedDataDict[Any]:
    """NeMo RL's preference batch: 2 * len(data_batch) sequences right-padded into
    ``input_ids``, interleaved (sample 2i is pair i's chosen conversation, 2i+1 its rejected
    one: what ``PreferenceLossFn.split_output_tensor`` takes apart, and a microbatch of even
    size holds whole pairs), the final (completion) turn as ``token_mask`` and each pair's
    ``loss_multiplier`` as both samples' ``sample_mask``."""
    message_log: list[Any] = []
    for datum in data_batch:
        message_log += [datum["message_log_chosen"], datum["message_log_rejected"]]
    add_loss_mask_to_message_log(message_log, only_unmask_final=True)
    flat, input_lengths = batched_message_log_to_flat_message(
        message_log,
        pad_value_dict={"token_ids": tokenizer.pad_token_id},
        make_sequence_length_divisible_by=make_sequence_length_divisible_by,
    )
    sample_mask = [datum["loss_multiplier"] for datum in data_batch for _ in range(2)]
    return BatchedDataDict(
        {
            "input_ids": flat["token_ids"],
            "input_lengths": input_lengths,
            "token_mask": flat["token_loss_mask"].float(),
            "sample_mask": torch.tensor(sample_mask, dtype=torch.float32),
        }
    )
