"""The driver side shared by ``MegatronPolicy`` and ``MegatronValue``.

It launches the ranks, checks inputs before they reach a rank (where an error would
surface as a remote traceback), and turns per-rank results into one answer.
"""

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.distributed.world import is_writer
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.models.megatron.launcher import WorkerGroup, launch
from nemo_rl_core.models.megatron.worker import Head, WorkerSpec
from nemo_rl_core.models.policy.config import TrainedModelConfig
from nemo_rl_core.models.policy.hf_loading import VocabMismatchError, load_tokenizer
from nemo_rl_core.models.policy.utils import check_model_inputs


def check_megatron_support(config: TrainedModelConfig) -> None:
    """Reject features the Megatron backend does not implement, naming the key."""
    if config.sequence_packing.enabled:
        raise NotImplementedError(
            "sequence_packing.enabled=true is not supported by the megatron training backend; "
            "set it to false or use training_backend=hf"
        )


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


class MegatronDriver:
    """Ranks for one model (policy or value) and the calls every such model shares."""

    def __init__(
        self,
        config: TrainedModelConfig,
        head: Head,
        tokenizer: PreTrainedTokenizerBase | None,
        weights_path: str | Path | None,
        optimizer_path: str | Path | None,
        init_optimizer: bool,
        init_reference_model: bool,
    ) -> None:
        check_megatron_support(config)
        self.cfg = config
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        spec = WorkerSpec(
            config=config,
            model_path=str(resolve_model(config.model_name)),
            weights_path=str(resolve_model(str(weights_path))) if weights_path else None,
            optimizer_path=str(optimizer_path) if optimizer_path else None,
            init_optimizer=init_optimizer,
            init_reference_model=init_reference_model,
            head=head,
        )
        self.workers: WorkerGroup = launch(spec)
        self.vocab_size: int = self.workers.run("vocab_size")[0]
        if len(self.tokenizer) > self.vocab_size:
            self.workers.shutdown()
            raise VocabMismatchError(
                f"tokenizer has {len(self.tokenizer)} tokens but the model has "
                f"{self.vocab_size} embedding rows; use model_name's tokenizer"
            )

    def _gathered(self, method: str, data: BatchedDataDict, *args: Any) -> list[Any]:
        check_model_inputs(data, self.cfg.max_total_sequence_length, self.vocab_size)
        return self.workers.run(method, data, *args)

    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        """One optimizer step per global batch of ``gbs`` samples (NeMo RL's normalization)."""
        parts = self._gathered("train", data, loss_fn, eval_mode, gbs, mbs)
        return merge_train_results(parts, self.cfg.precision)

    def offload(self, weights: bool) -> None:
        """Every rank's gradient buffers and optimizer state into host memory, with
        ``weights`` its parameters too; each rank's next pass brings back what it needs."""
        self.workers.run("offload", weights)

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        """Weights, gradient buffers and optimizer state back in device memory (ranks
        switch train/eval mode per call)."""
        self.workers.run("onload", True)

    def finish_training(self, *args: Any, **kwargs: Any) -> None:
        """Ranks switch train/eval mode per call; nothing to move."""

    def save_checkpoint(
        self,
        weights_path: str | Path,
        optimizer_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
    ) -> None:
        """HF layout (config.json, model.safetensors, generation_config.json, tokenizer) in
        ``weights_path``; Megatron optimizer/scheduler state per rank in ``optimizer_path``."""
        self.workers.run(
            "save_checkpoint", str(weights_path), str(optimizer_path) if optimizer_path else None
        )
        if not is_writer():
            return
        self.tokenizer.save_pretrained(str(weights_path))
        if tokenizer_path is not None:
            self.tokenizer.save_pretrained(str(tokenizer_path))

    def shutdown(self) -> bool:
        self.workers.shutdown()
        return True
