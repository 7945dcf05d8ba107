"""The value-model contract of NeMo RL (``nemo_rl.models.value.interfaces``)."""

from abc import ABC, abstractmethod
from typing import Any, TypedDict

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec
from nemo_rl_core.utils.timer import Timer


class ValueOutputSpec(TypedDict):
    values: torch.Tensor  # [batch_size, sequence_length]


class ValueInterface(ABC):
    """Abstract base class defining the interface for value functions."""

    @abstractmethod
    def get_values(
        self, data: BatchedDataDict[GenerationDatumSpec], timer: Timer | None = None
    ) -> BatchedDataDict[ValueOutputSpec]: ...

    @abstractmethod
    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Timer | None = None,
    ) -> dict[str, Any]: ...

    @abstractmethod
    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def prepare_for_inference(self, *args: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def finish_training(self, *args: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def shutdown(self) -> bool: ...
