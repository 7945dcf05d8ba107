"""Reward metrics every environment reports after a rollout."""

from typing import Any

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def batch_rewards(batch: BatchedDataDict) -> torch.Tensor:
    """The per-sample rewards of a finished batch: ``rewards`` or the rollout's ``total_reward``
    (a multi-reward environment's ``[B, K]`` rewards: the first, its correctness, as NeMo RL
    reads them)."""
    for key in ("rewards", "total_reward"):
        if key in batch:
            rewards = torch.as_tensor(batch[key], dtype=torch.float32)
            return rewards[:, 0] if rewards.dim() == 2 else rewards
    raise KeyError(f"batch has neither 'rewards' nor 'total_reward' (keys: {sorted(batch.keys())})")


def reward_metrics(batch: BatchedDataDict) -> dict[str, Any]:
    """Accuracy (mean reward), and pass@k over samples sharing a prompt ``idx`` if present."""
    rewards = batch_rewards(batch)
    metrics: dict[str, Any] = {
        "accuracy": rewards.mean().item() if len(rewards) else 0.0,
        "num_samples": len(rewards),
    }
    if "is_end" in batch:
        metrics["fraction_of_samples_properly_ended"] = (
            torch.as_tensor(batch["is_end"], dtype=torch.float32).mean().item()
        )
    if "idx" in batch:
        solved: dict[int, bool] = {}
        for idx, reward in zip(batch["idx"], rewards.tolist(), strict=True):
            key = int(idx)
            solved[key] = solved.get(key, False) or reward >= 1.0
        metrics["pass@samples_per_prompt"] = sum(solved.values()) / max(len(solved), 1)
    return metrics
