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

from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.models.megatron.launcher import WorkerGroup, launch
from nemo_rl_core.models.megatron.worker import WorkerSpec
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.models.policy.hf_loading import VocabMismatchError, load_tokenizer
from nemo_rl_core.models.policy.interfaces import (
    LogprobOutputSpec,
    PolicyInterface,
    ReferenceLogprobOutputSpec,
    TopkLogitsOutputSpec,
)


def check_megatron_support(config: PolicyConfig) -> None:
    """Reject policy features the Megatron backend does not implement, naming the key."""
    for key in ("dynamic_batching", "sequence_packing"):
        if getattr(config, key).enabled:
            raise NotImplementedError(
                f"policy.{key}.enabled=true is not supported by the megatron training backend; "
                f"set it to false or use policy.training_backend=hf"
            )


def check_inputs(data: BatchedDataDict, config: PolicyConfig, vocab_size: int) -> None:
    """Shape, length and token-id checks that would otherwise surface as an opaque rank error."""
    for key in ("input_ids", "input_lengths"):
        if key not in data:
            raise KeyError(f"data needs {key!r} (has {sorted(data.keys())})")
    ids, lengths = data["input_ids"], data["input_lengths"]
    if ids.dim() != 2 or lengths.shape != ids.shape[:1]:
        raise ValueError(
            f"input_ids must be [batch, seq] and input_lengths [batch]; got "
            f"{tuple(ids.shape)} and {tuple(lengths.shape)}"
        )
    if not ids.shape[0]:
        return
    longest = int(lengths.max())
    if longest > config.max_total_sequence_length:
        raise ValueError(
            f"a sequence has {longest} tokens, more than policy.max_total_sequence_length="
            f"{config.max_total_sequence_length}"
        )
    valid = torch.arange(ids.shape[1])[None] < lengths[:, None]
    used = ids[valid]
    if used.numel() and (int(used.max()) >= vocab_size or int(used.min()) < 0):
        raise VocabMismatchError(
            f"input_ids hold token id {int(used.max())} (min {int(used.min())}) but the model "
            f"has {vocab_size} embedding rows; check policy.tokenizer.name"
        )


class MegatronPolicy(PolicyInterface):
    """NeMo RL's Megatron policy: logprobs, reference logprobs, top-k logits, train, checkpoints."""

    def __init__(
        self,
        config: PolicyConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        weights_path: str | Path | None = None,
        optimizer_path: str | Path | None = None,
        init_optimizer: bool = True,
        init_reference_model: bool = True,
    ) -> None:
        check_megatron_support(config)
        self.cfg = config
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        self.model_path = resolve_model(config.model_name)
        spec = WorkerSpec(
            config=config,
            model_path=str(self.model_path),
            weights_path=str(resolve_model(str(weights_path))) if weights_path else None,
            optimizer_path=str(optimizer_path) if optimizer_path else None,
            init_optimizer=init_optimizer,
            init_reference_model=init_reference_model,
        )
        self.workers: WorkerGroup = launch(spec)
        self.vocab_size = self.workers.run("vocab_size")[0]
        if len(self.tokenizer) > self.vocab_size:
            raise VocabMismatchError(
                f"tokenizer has {len(self.tokenizer)} tokens but the model has "
                f"{self.vocab_size} embedding rows; use policy.model_name's tokenizer"
            )

    def _gathered(self, method: str, data: BatchedDataDict, *args: Any) -> list[Any]:
        check_inputs(data, self.cfg, self.vocab_size)
        return self.workers.run(method, data, *args)

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

    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
    ) -> dict[str, Any]:
        """One optimizer step per global batch of ``gbs`` samples (NeMo RL's normalization)."""
        parts = self._gathered("train", data, loss_fn, eval_mode, gbs, mbs)
        return merge_train_results(parts, self.cfg.precision)

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
            "(policy.training_backend=hf); the megatron backend has no FP8 path on CPU"
        )

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        """Ranks switch train/eval mode per call; nothing to move."""

    def prepare_for_lp_inference(self) -> None:
        """Ranks switch train/eval mode per call; nothing to move."""

    def finish_training(self, *args: Any, **kwargs: Any) -> None:
        """Ranks switch train/eval mode per call; nothing to move."""

    def save_checkpoint(
        self,
        weights_path: str | Path,
        optimizer_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
    ) -> None:
        """HF layout (config.json, model.safetensors, generation_config.json, tokenizer) in
        ``weights_path``, Megatron optimizer/scheduler state per rank in ``optimizer_path``."""
        self.workers.run(
            "save_checkpoint",
            str(weights_path),
            str(optimizer_path) if optimizer_path else None,
        )
        self.tokenizer.save_pretrained(str(weights_path))
        if tokenizer_path is not None:
            self.tokenizer.save_pretrained(str(tokenizer_path))

    def state_dict_for_refit(self) -> dict[str, torch.Tensor]:
        """HF-named full weights (gathered over tensor-parallel ranks) for a generation engine."""
        return self.workers.run("hf_state_dict")[0]

    def shutdown(self) -> bool:
        self.workers.shutdown()
        return True


def merge_train_results(parts: list[dict[str, Any]], precision: str) -> dict[str, Any]:
    """Sum the data-parallel ranks' losses (each already a share of the global loss)."""
    first = parts[0]
    metrics: dict[str, list[Any]] = {}
    for part in parts:
        for key, values in part["all_mb_metrics"].items():
            metrics.setdefault(key, []).extend(values)
    return {
        "loss": torch.stack([part["loss"] for part in parts]).sum(0),
        "grad_norm": first["grad_norm"],
        "lr": first["lr"],
        "global_valid_seqs": (metrics.get("global_valid_seqs") or [0.0])[0],
        "global_valid_toks": (metrics.get("global_valid_toks") or [0.0])[0],
        "model_dtype": precision,
        "all_mb_metrics": metrics,
    }
