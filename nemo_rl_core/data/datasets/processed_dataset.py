"""Rows -> DatumSpecs on access, and a batch of DatumSpecs -> one ``BatchedDataDict``.

NeMo RL's ``AllTaskProcessedDataset``, ``rl_collate_fn`` and ``preference_collate_fn``: each row is processed by its
task's processor (``task_name`` column, else the default task) when it is read, so a large
dataset costs no tokenization up front.
"""

from collections.abc import Sequence
from typing import Any

import torch

from nemo_rl_core.data.datasets.utils import assert_no_double_bos
from nemo_rl_core.data.interfaces import (
    UNCAPPED_LENGTH,
    DatumSpec,
    LLMMessageLogType,
    PreferenceDatumSpec,
    TaskDataPreProcessFnCallable,
    TaskDataProcessFnCallable,
    TaskDataSpec,
)
from nemo_rl_core.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    batched_message_log_to_flat_message,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class AllTaskProcessedDataset:
    """A map-style dataset of ``DatumSpec``s over rows of one or more tasks.

    ``task_data_processors`` is one processor for every row (with
    ``default_task_data_spec``), or one ``(spec, processor)`` per task, picked by each row's
    ``task_name`` (a task's spec takes what it leaves unset from the default spec, when one
    is given). A task's preprocessor, if any, reshapes its rows first."""

    def __init__(
        self,
        dataset: Sequence[dict[str, Any]],
        tokenizer: Any,
        default_task_data_spec: TaskDataSpec | None,
        task_data_processors: dict[str, tuple[TaskDataSpec, TaskDataProcessFnCallable]]
        | TaskDataProcessFnCallable,
        task_data_preprocessors: dict[str, TaskDataPreProcessFnCallable]
        | TaskDataPreProcessFnCallable
        | None = None,
        max_seq_length: int | None = None,
    ):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.default_task_data_spec = default_task_data_spec
        self.task_data_processors = task_data_processors
        self.task_data_preprocessors = task_data_preprocessors
        self.max_seq_length = max_seq_length
        self._bos_checked = False
        if isinstance(task_data_processors, dict) and default_task_data_spec is not None:
            for spec, _ in task_data_processors.values():
                spec.copy_defaults(default_task_data_spec)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int) -> DatumSpec | PreferenceDatumSpec:
        row = self._preprocessed(self.dataset[idx])
        if callable(self.task_data_processors):
            if self.default_task_data_spec is None:
                raise ValueError("one processor for every row needs a default_task_data_spec")
            spec, processor = self.default_task_data_spec, self.task_data_processors
        else:
            default_task = getattr(self.default_task_data_spec, "task_name", None)
            task = row.get("task_name") or default_task
            if task not in self.task_data_processors:
                raise KeyError(
                    f"row {idx} has task_name {task!r}; processors exist for "
                    f"{sorted(self.task_data_processors)}"
                )
            spec, processor = self.task_data_processors[task]
        limit = UNCAPPED_LENGTH if self.max_seq_length is None else self.max_seq_length
        datum = processor(row, spec, self.tokenizer, limit, idx)
        self._check_bos_once(datum)
        return datum

    def _preprocessed(self, row: dict[str, Any]) -> dict[str, Any]:
        preprocessors = self.task_data_preprocessors
        if isinstance(preprocessors, dict):
            preprocess = preprocessors.get(row.get("task_name") or "")
        else:
            preprocess = preprocessors
        return preprocess(row) if preprocess is not None else row

    def _check_bos_once(self, datum: DatumSpec | PreferenceDatumSpec) -> None:
        """The first datum's first message must not start with two BOS tokens."""
        if self._bos_checked:
            return
        fields: dict[str, Any] = dict(datum)
        log: LLMMessageLogType = fields.get("message_log") or fields.get("message_log_chosen") or []
        if log and "token_ids" in log[0]:
            assert_no_double_bos(log[0]["token_ids"], self.tokenizer)
        self._bos_checked = True


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
