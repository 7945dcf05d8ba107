"""The policy contract of NeMo RL (``nemo_rl.models.policy.interfaces``).

Next-token logprobs are aligned with ``input_ids``: position ``t`` holds
``log p(input_ids[t] | input_ids[:t])`` and position 0 is 0.
"""

from abc import ABC, abstractmethod
from typing import Any, TypedDict

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec


class LogprobOutputSpec(TypedDict):
    logprobs: torch.Tensor


class ReferenceLogprobOutputSpec(TypedDict):
    reference_logprobs: torch.Tensor


class ScoreOutputSpec(TypedDict):
    scores: torch.Tensor


class TopkLogitsOutputSpec(TypedDict):
    """Per-position top-k logits and their global token indices (S-1 positions)."""

    topk_logits: torch.Tensor
    topk_indices: torch.Tensor


class PolicyInterface(ABC):
    """Abstract base class defining the interface for RL policies."""

    @abstractmethod
    def get_logprobs(
        self, data: BatchedDataDict[GenerationDatumSpec]
    ) -> BatchedDataDict[LogprobOutputSpec]: ...

    @abstractmethod
    def get_reference_policy_logprobs(
        self, data: BatchedDataDict[GenerationDatumSpec], micro_batch_size: int | None = None
    ) -> BatchedDataDict[ReferenceLogprobOutputSpec]: ...

    @abstractmethod
    def get_topk_logits(
        self,
        data: BatchedDataDict[GenerationDatumSpec],
        k: int,
        micro_batch_size: int | None = None,
    ) -> BatchedDataDict[TopkLogitsOutputSpec]: ...

    @abstractmethod
    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
    ) -> dict[str, Any]: ...

    @abstractmethod
    def calibrate_qkv_fp8_scales(
        self,
        data: BatchedDataDict[GenerationDatumSpec],
        micro_batch_size: int | None = None,
        percentile: float = 99.9,
        margin: float = 1.05,
        include_q: bool = False,
    ) -> dict[str, Any]: ...

    @abstractmethod
    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def finish_training(self, *args: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def shutdown(self) -> bool: ...


class ColocatablePolicyInterface(PolicyInterface):
    """A policy that shares devices with a generation engine and refits it."""

    @abstractmethod
    def init_collective(
        self, ip: str, port: int, world_size: int, *, train_world_size: int
    ) -> list[Any]: ...

    @abstractmethod
    def offload_before_refit(self) -> None: ...

    @abstractmethod
    def offload_after_refit(self) -> None: ...

    @abstractmethod
    def prepare_refit_info(self) -> dict[str, Any] | None: ...

    @abstractmethod
    def stream_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list[Any]: ...

    @abstractmethod
    def broadcast_weights_for_collective(
        self, kv_scales: dict[str, float] | None = None
    ) -> list[Any]: ...

    @abstractmethod
    def prepare_for_lp_inference(self) -> None: ...
