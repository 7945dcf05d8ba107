"""The environment contract of NeMo RL (``nemo_rl.environments.interfaces``)."""

import abc
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

import torch

from nemo_rl_core.data.interfaces import LLMMessageLogType
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

MetadataT = TypeVar("MetadataT")


class EnvironmentReturn(NamedTuple, Generic[MetadataT]):
    """What one environment step returns, one entry per sample."""

    observations: list[dict[str, str]]
    metadata: list[MetadataT]
    next_stop_strings: list[list[str] | None]
    rewards: torch.Tensor
    terminateds: torch.Tensor
    answers: list[str | None] | None


class EnvironmentInterface(abc.ABC, Generic[MetadataT]):
    # Whether ``step`` returns each response's extracted answer (``answers``), which
    # eval's cons@k votes over.
    extracts_answers: ClassVar[bool] = False

    @abc.abstractmethod
    def step(
        self,
        message_log_batch: list[LLMMessageLogType],
        metadata: list[MetadataT],
        *args: Any,
        **kwargs: Any,
    ) -> EnvironmentReturn[MetadataT]:
        """Answer the last assistant turn of each conversation."""

    @abc.abstractmethod
    def global_post_process_and_metrics(
        self, batch: BatchedDataDict
    ) -> tuple[BatchedDataDict, dict[str, Any]]:
        """Post-process a finished rollout batch and compute environment metrics."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook, most environments hold nothing
        """Release worker pools or models."""
