"""Sample filters of GRPO/DAPO, as pure functions of tensors.

Dynamic sampling drops prompt groups whose rewards are all equal (their GRPO advantages
are zero, so they only dilute the batch); overlong filtering takes truncated responses
out of the loss. Reward shaping and scaling are in ``reward_functions``.
"""

from typing import Any

import torch

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
