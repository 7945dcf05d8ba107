"""The generation contract of NeMo RL (``nemo_rl.models.generation.interfaces``).

``generate`` takes right-padded prompts and returns the full sequences
(prompt + response, right-padded) with per-token generation logprobs aligned to
``output_ids`` (0 on prompt and padding positions).
"""

from abc import ABC, abstractmethod
from typing import Any, NotRequired, TypedDict

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.config import GenerationConfig

__all__ = [
    "GenerationConfig",
    "GenerationDatumSpec",
    "GenerationInterface",
    "GenerationOutputSpec",
]


class GenerationDatumSpec(TypedDict):
    input_ids: torch.Tensor  # [B, S] right-padded prompts
    input_lengths: torch.Tensor  # [B]
    stop_strings: NotRequired[list[list[str] | None]]
    sample_seeds: NotRequired[torch.Tensor]  # [B] int64, per-sample sampling seeds


def sample_seeds(data: BatchedDataDict) -> list[int | None]:
    """The optional per-sample sampling seeds (``sample_seeds`` [B]); None where absent.

    Not in NeMo RL: staged training needs an iteration's samples to be reproducible by a
    fresh engine, whatever that engine generated before.
    """
    seeds = data.get("sample_seeds")
    if seeds is None:
        return [None] * len(data["input_lengths"])
    return [int(seed) for seed in seeds]


class GenerationOutputSpec(TypedDict):
    output_ids: torch.Tensor  # [B, S'] prompt + response, right-padded
    generation_lengths: torch.Tensor  # [B] response tokens only
    unpadded_sequence_lengths: torch.Tensor  # [B] prompt + response
    logprobs: torch.Tensor  # [B, S'] generation logprobs aligned with output_ids


class GenerationInterface(ABC):
    """Abstract base class for generation backends (vLLM, HF)."""

    def init_collective(
        self, ip: str, port: int, world_size: int, *, train_world_size: int
    ) -> list[Any]:
        """Join a weight-broadcast group; single-process backends have none."""
        return []

    @abstractmethod
    def generate(
        self, data: BatchedDataDict[GenerationDatumSpec], greedy: bool
    ) -> BatchedDataDict[GenerationOutputSpec]: ...

    @abstractmethod
    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool: ...

    @abstractmethod
    def finish_generation(self, *args: Any, **kwargs: Any) -> bool: ...

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:  # noqa: B027
        """Receive names/shapes/dtypes of the weights a refit will send."""

    def update_weights_from_state_dict(self, state_dict: dict[str, torch.Tensor]) -> bool:
        """Refit the running engine in place from a state dict (HF names)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be refit from a state dict")

    def update_weights_from_checkpoint(self, checkpoint_dir: str) -> bool:
        """Refit the running engine in place from an HF safetensors directory."""
        raise NotImplementedError(f"{type(self).__name__} cannot be refit from a checkpoint")

    def take_engine_metrics(self) -> dict[str, Any]:
        """Metrics the engine sampled while it generated (vLLM's load), since the last
        ``prepare_for_generation``; none by default."""
        return {}

    def invalidate_kv_cache(self) -> bool:
        """Drop caches computed with the old weights (vLLM's prefix cache) after a refit."""
        return False

    def shutdown(self) -> bool:
        return True
