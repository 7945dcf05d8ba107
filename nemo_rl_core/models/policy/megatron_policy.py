"""NeMo RL's policy on megatron-core: the same interface and numbers as ``HFPolicy``.

The ranks (``megatron_cfg.tensor_model_parallel_size x data_parallel_size``) run in this
process when there is one and under ``torchrun --standalone`` otherwise; either way every
call here looks the same. Weights come from and go to HF safetensors directories, so a
checkpoint of this policy loads in transformers, vLLM and ``HFPolicy``.
"""

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec
from nemo_rl_core.models.megatron.driver import MegatronDriver
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.models.policy.interfaces import (
    ColocatablePolicyInterface,
    LogprobOutputSpec,
    ReferenceLogprobOutputSpec,
    TopkLogitsOutputSpec,
)
from nemo_rl_core.models.policy.state_dict_refit import StateDictRefit


class MegatronPolicy(MegatronDriver, StateDictRefit, ColocatablePolicyInterface):
    """NeMo RL's Megatron policy: logprobs, reference logprobs, top-k logits, train,
    checkpoints, and the colocated lifecycle (its ranks leave the GPU to the generation
    engine between steps)."""

    def __init__(
        self,
        config: PolicyConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        weights_path: str | Path | None = None,
        optimizer_path: str | Path | None = None,
        init_optimizer: bool = True,
        init_reference_model: bool = True,
    ) -> None:
        super().__init__(
            config,
            "lm",
            tokenizer,
            weights_path,
            optimizer_path,
            init_optimizer,
            init_reference_model,
        )
        self.offload_optimizer_for_logprob = config.offload_optimizer_for_logprob

    def get_logprobs(
        self, data: BatchedDataDict[GenerationDatumSpec], micro_batch_size: int | None = None
    ) -> BatchedDataDict[LogprobOutputSpec]:
        """``logprobs [batch, seq]``: position t holds log p(token t | tokens < t); position 0 is 0."""
        parts = self._gathered("get_logprobs", data, micro_batch_size)
        return BatchedDataDict({"logprobs": torch.cat(parts)})

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict[GenerationDatumSpec], micro_batch_size: int | None = None
    ) -> BatchedDataDict[ReferenceLogprobOutputSpec]:
        """Logprobs under the base model (``policy.model_name``), as ``reference_logprobs``."""
        parts = self._gathered("get_reference_policy_logprobs", data, micro_batch_size)
        return BatchedDataDict({"reference_logprobs": torch.cat(parts)})

    def get_topk_logits(
        self,
        data: BatchedDataDict[GenerationDatumSpec],
        k: int,
        micro_batch_size: int | None = None,
    ) -> BatchedDataDict[TopkLogitsOutputSpec]:
        """Top-``k`` logits and token ids for the next token at positions 0..S-2."""
        if not 1 <= k <= self.vocab_size:
            raise ValueError(f"k must be in [1, {self.vocab_size}] (vocab size), got {k}")
        parts = self._gathered("get_topk_logits", data, k, micro_batch_size)
        return BatchedDataDict(
            {
                "topk_logits": torch.cat([values for values, _ in parts]),
                "topk_indices": torch.cat([indices for _, indices in parts]),
            }
        )

    def calibrate_qkv_fp8_scales(
        self,
        data: BatchedDataDict[GenerationDatumSpec],
        micro_batch_size: int | None = None,
        percentile: float = 99.9,
        margin: float = 1.05,
        include_q: bool = False,
    ) -> dict[str, Any]:
        raise NotImplementedError(
            "FP8 KV-cache calibration runs on the hf training backend "
            "(policy.training_backend=hf); the megatron backend has no FP8 path"
        )

    def prepare_for_lp_inference(self) -> None:
        """Weights back in device memory, gradient buffers out; with
        ``policy.offload_optimizer_for_logprob`` the optimizer state waits in host memory
        until training."""
        self.workers.run("onload", False)
        if self.offload_optimizer_for_logprob:
            self.offload(weights=False)

    def offload_before_refit(self) -> None:
        """Gradient buffers and optimizer state into host memory while the weights are sent."""
        self.offload(weights=False)

    def offload_after_refit(self) -> None:
        """Everything into host memory: the colocated engine generates next."""
        self.offload(weights=True)

    def state_dict_for_refit(self) -> dict[str, torch.Tensor]:
        """HF-named full weights (gathered over tensor-parallel ranks) for a generation engine."""
        return self.workers.run("hf_state_dict")[0]

    def prepare_refit_info(self) -> dict[str, Any] | None:
        """``{name: (shape, dtype)}`` of what ``state_dict_for_refit`` sends."""
        return {name: (tuple(t.shape), t.dtype) for name, t in self.state_dict_for_refit().items()}
