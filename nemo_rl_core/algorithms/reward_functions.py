"""Reward shaping and scaling of NeMo RL (``nemo_rl.algorithms.reward_functions``, and the
``scale_rewards`` of ``nemo_rl.algorithms.grpo``): what happens to the environments'
``total_reward`` before the advantages.

Both take the batch and their config section, change ``batch["total_reward"]`` and return
the same batch. The configs accept NeMo RL's way of building them in code (partial, then
``cfg["key"] = value``) and are checked when applied; a run's YAML is checked by key
before any work (:func:`reward_shaping_config_problems`).
"""

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.reward_config import (
    DAPO_KEYS,
    RewardScalingConfig,
    RewardShapingConfig,
    reward_shaping_config_problems,
)
from nemo_rl_core.algorithms.utils import get_gdpo_reward_component_keys
from nemo_rl_core.config.base import validate_section
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.utils.config import filled


class RewardShapingError(ValueError, AssertionError):
    """Reward shaping refused its config or batch.

    NeMo RL raises ValueError for missing DAPO keys and asserts the rest; this is both, so
    either ``except`` of a NeMo RL caller still catches it.
    """


def apply_reward_shaping(
    batch: BatchedDataDict, cfg: RewardShapingConfig | Mapping[str, Any]
) -> BatchedDataDict:
    """Shape ``batch["total_reward"]`` in place (a no-op while disabled); the rewards
    before shaping stay in ``unshaped_total_reward`` for dynamic sampling, which filters
    prompt groups on the task's own reward, not on length penalties.

    Response lengths are ``response_token_lengths`` when the batch has them, else the
    tokens of each sample's first assistant turn. The stop-properly penalty reads the
    batch's ``truncated`` flags.
    """
    cfg = validate_section(RewardShapingConfig, cfg, "reward_shaping")
    if not cfg.enabled:
        return batch
    problems = reward_shaping_config_problems(cfg)
    if problems:
        raise RewardShapingError("; ".join(problems))
    rewards = batch["total_reward"]
    batch["unshaped_total_reward"] = rewards.clone()
    if cfg.stop_properly_penalty_coef is not None:
        ignored = [key for key in DAPO_KEYS if getattr(cfg, key) is not None]
        if ignored:
            warnings.warn(
                f"reward_shaping.stop_properly_penalty_coef is set, so {', '.join(ignored)} "
                "(DAPO's overlong penalty) are ignored; set it to null to use them",
                stacklevel=2,
            )
        if batch.get("truncated") is None:
            raise RewardShapingError(
                "truncated field not found in batch: the stop-properly penalty scales the "
                "rewards of truncated responses"
            )
        truncated = torch.as_tensor(batch["truncated"], dtype=torch.bool, device=rewards.device)
        batch["total_reward"] = torch.where(
            truncated, rewards * cfg.stop_properly_penalty_coef, rewards
        )
        return batch
    lengths = _response_lengths(batch)
    if len(lengths) != len(rewards):
        raise RewardShapingError(
            "The number of messages in the batch must match the number of rewards "
            f"({len(lengths)} responses, {len(rewards)} rewards)"
        )
    buffer = filled(cfg.overlong_buffer_length, "reward_shaping.overlong_buffer_length")
    expected = filled(cfg.max_response_length, "reward_shaping.max_response_length") - buffer
    excess = torch.tensor(lengths, dtype=rewards.dtype, device=rewards.device) - expected
    scale = filled(cfg.overlong_buffer_penalty, "reward_shaping.overlong_buffer_penalty")
    penalty = (-excess / buffer * scale).clamp(max=0)
    batch["total_reward"] = rewards + penalty
    return batch


def _response_lengths(batch: BatchedDataDict) -> list[int]:
    if batch.get("response_token_lengths") is not None:
        return [int(n) for n in batch["response_token_lengths"]]
    lengths = []
    for index, message_log in enumerate(batch["message_log"]):
        first = next((m for m in message_log if m["role"] == "assistant"), None)
        if first is None:
            raise RewardShapingError(
                f"Assistant response not found during reward shaping (sample {index})"
            )
        lengths.append(len(first["token_ids"]))
    return lengths


def scale_rewards(
    batch: BatchedDataDict, cfg: RewardScalingConfig | Mapping[str, Any]
) -> BatchedDataDict:
    """Scale ``batch["total_reward"]`` and each reward component (``reward1``, ... of a
    multi-reward environment) in place (a no-op while disabled), so environments with
    different reward ranges mix."""
    cfg = validate_section(RewardScalingConfig, cfg, "reward_scaling")
    if cfg.enabled:
        for key in ["total_reward", *get_gdpo_reward_component_keys(batch)]:
            clamped = batch[key].clamp(cfg.source_min, cfg.source_max)
            fraction = (clamped - cfg.source_min) / (cfg.source_max - cfg.source_min)
            batch[key] = cfg.target_min + fraction * (cfg.target_max - cfg.target_min)
    return batch
