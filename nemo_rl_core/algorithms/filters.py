"""Sample filters and reward shaping/scaling of GRPO/DAPO, as pure functions of tensors.

Dynamic sampling drops prompt groups whose rewards are all equal (their GRPO advantages
are zero, so they only dilute the batch); overlong filtering takes truncated responses
out of the loss; reward shaping penalizes responses that run into the length limit.
"""

from typing import Any

import torch

from nemo_rl_core.algorithms.config import RewardScalingConfig, RewardShapingConfig
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def dynamic_sampling_filter(
    batch: BatchedDataDict, std: torch.Tensor
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Keep the samples whose prompt group has reward std > 0 (DAPO dynamic sampling).

    ``std`` [B] is the per-sample group std from
    :func:`~nemo_rl_core.algorithms.utils.calculate_baseline_and_std_per_prompt`.
    """
    if std.shape[0] != batch.size:
        raise ValueError(f"std has {std.shape[0]} entries, batch has {batch.size} samples")
    keep = (std != 0).nonzero(as_tuple=True)[0]
    return batch.select_indices(keep), {
        "dynamic_sampling_kept_samples": int(keep.numel()),
        "dynamic_sampling_kept_fraction": keep.numel() / max(batch.size, 1),
    }


def accumulate_dynamic_sampling_batch(
    cached: BatchedDataDict | None, filtered: BatchedDataDict, target_size: int
) -> tuple[BatchedDataDict, bool]:
    """Append ``filtered`` to the samples kept so far; ``(batch, done)``.

    Once at least ``target_size`` samples are kept, the batch is cut to exactly that size
    (whole groups first, as they were generated) and ``done`` is true; otherwise the
    caller generates another batch (at most ``dynamic_sampling_max_gen_batches``).
    """
    merged = (
        filtered
        if cached is None or cached.size == 0
        else type(filtered).from_batches([cached, filtered])
    )
    if merged.size < target_size:
        return merged, False
    return merged.select_indices(list(range(target_size))), True


def apply_overlong_filtering(
    sample_mask: torch.Tensor, truncated: torch.Tensor | list[bool]
) -> torch.Tensor:
    """``sample_mask`` with truncated responses (hit the length limit) set to 0."""
    truncated = torch.as_tensor(truncated, dtype=torch.bool, device=sample_mask.device)
    if truncated.shape != sample_mask.shape:
        raise ValueError(
            f"truncated {tuple(truncated.shape)} must match sample_mask {tuple(sample_mask.shape)}"
        )
    return sample_mask.masked_fill(truncated, 0)


def apply_reward_shaping(
    rewards: torch.Tensor, response_lengths: torch.Tensor, cfg: RewardShapingConfig
) -> torch.Tensor:
    """DAPO's soft overlong punishment added to ``rewards`` (no-op unless enabled).

    With L = ``max_response_length``, C = ``overlong_buffer_length`` and
    P = ``overlong_buffer_penalty``: penalty = min(0, (L - C - len) / C) * P, i.e. 0 up to
    L - C tokens, then linear down to -P at L tokens (and beyond).
    """
    if not cfg.enabled:
        return rewards
    expected = cfg.max_response_length - cfg.overlong_buffer_length
    excess = response_lengths.to(rewards.dtype) - expected
    penalty = (-excess / max(cfg.overlong_buffer_length, 1)).clamp(min=-1.0, max=0.0)
    return rewards + penalty * cfg.overlong_buffer_penalty


def scale_rewards(rewards: torch.Tensor, cfg: RewardScalingConfig) -> torch.Tensor:
    """Clamp to [source_min, source_max] and map linearly onto [target_min, target_max]
    (no-op unless enabled), so environments with different reward ranges mix."""
    if not cfg.enabled:
        return rewards
    clamped = rewards.clamp(cfg.source_min, cfg.source_max)
    fraction = (clamped - cfg.source_min) / (cfg.source_max - cfg.source_min)
    return cfg.target_min + fraction * (cfg.target_max - cfg.target_min)
