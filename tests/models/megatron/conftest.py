"""Policy configs and batches shared by the Megatron backend tests."""

from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.config import PolicyConfig, TrainedModelConfig

LR = 1e-3


def policy_config(
    model_dir: Path,
    backend: str,
    config_cls: type[TrainedModelConfig] = PolicyConfig,
    **megatron: Any,
) -> TrainedModelConfig:
    """fp32, constant LR, no weight decay: the settings both backends implement identically
    (Megatron exempts norms and biases from weight decay, torch AdamW does not)."""
    base: dict[str, Any] = {
        "model_name": str(model_dir),
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 2,
        "max_total_sequence_length": 32,
        "precision": "float32",
        "max_grad_norm": 1.0,
        "optimizer": {
            "name": "torch.optim.AdamW",
            "kwargs": {"lr": LR, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8},
        },
    }
    if backend == "megatron":
        base["megatron_cfg"] = {
            "enabled": True,
            "optimizer": {"lr": LR, "min_lr": LR, "weight_decay": 0.0, "clip_grad": 1.0},
            "scheduler": {"lr_warmup_iters": 0, "lr_warmup_init": LR},
            **megatron,
        }
    return config_cls(**base)


def make_batch(vocab_size: int, batch: int = 4, seq: int = 12, seed: int = 0) -> BatchedDataDict:
    """Right-padded token batch with NeMo RL's masks and PG-loss inputs (distinct lengths)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([seq - (i * 3) % 7 for i in range(batch)])
    ids = torch.randint(0, vocab_size, (batch, seq), generator=gen)
    valid = torch.arange(seq)[None] < lengths[:, None]
    ids = ids * valid
    token_mask = valid.float()
    token_mask[:, :3] = 0  # the prompt
    return BatchedDataDict(
        {
            "input_ids": ids,
            "input_lengths": lengths,
            "token_mask": token_mask,
            "sample_mask": torch.ones(batch),
            "advantages": torch.randn(batch, seq, generator=gen),
            "prev_logprobs": torch.zeros(batch, seq),
            "generation_logprobs": torch.zeros(batch, seq),
            "reference_policy_logprobs": torch.zeros(batch, seq),
            "returns": torch.randn(batch, seq, generator=gen),
            "values": torch.zeros(batch, seq),
        }
    )


@pytest.fixture(scope="module")
def vocab_size(tiny_model_dir: Path) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size
