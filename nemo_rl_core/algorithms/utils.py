"""Shared math of the algorithms (``nemo_rl.algorithms.utils``): masked means, KL
estimators, per-prompt baselines.

Every loss normalizes through :func:`masked_mean` with a *global* normalization factor,
which is what makes microbatch losses sum exactly to the full-batch loss.
"""

from typing import Literal

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

KLType = Literal["k1", "k2", "k3"]


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None = None,
    global_normalization_factor: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """``sum(values * mask) / (normalizer + 1e-8)``.

    The normalizer is ``mask.sum(dim)`` unless ``global_normalization_factor`` is given;
    passing the global count makes the result additive over microbatches.
    """
    if global_normalization_factor is None:
        normalization_factor = mask.sum(dim=dim)
    else:
        normalization_factor = global_normalization_factor
    return (values * mask).sum(dim=dim) / (normalization_factor + 1e-8)


def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: KLType = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
) -> torch.Tensor:
    """Per-token estimator of KL(pi || pi_ref) from samples of pi (Schulman 2020).

    With ``r = log pi_ref - log pi`` (clamped to ``+-input_clamp_value``):
    k1 = -r, k2 = r^2 / 2, k3 = exp(r) - 1 - r; the result is clamped to
    ``+-output_clamp_value``. Clamps keep one wild token from dominating the batch.
    """
    logr = logprobs_reference - logprobs
    if input_clamp_value is not None:
        logr = logr.clamp(min=-input_clamp_value, max=input_clamp_value)
    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k2":
        kl = logr.square() / 2
    elif kl_type == "k3":
        kl = torch.exp(logr) - 1 - logr
    else:
        raise ValueError(f"kl_type must be one of 'k1', 'k2', 'k3', got {kl_type!r}")
    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)
    return kl


def calculate_baseline_and_std_per_prompt(
    prompts: torch.Tensor,
    rewards: torch.Tensor,
    valid_mask: torch.Tensor,
    leave_one_out_baseline: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline and std of the rewards of the other samples of its prompt.

    Samples with identical rows in ``prompts`` ([B, P] token ids, or [B] group ids) form a
    group. For sample i the reference set is the group's valid samples, without i when
    ``leave_one_out_baseline``; baseline = its mean, std = its Bessel-corrected (n-1)
    standard deviation (0 when the set has fewer than 2 samples). A group with at most
    one valid sample gets baseline = reward and std = 0, so its advantages are zero.
    """
    if prompts.dim() == 1:
        prompts = prompts.unsqueeze(-1)
    if prompts.shape[0] != rewards.shape[0] or valid_mask.shape != rewards.shape:
        raise ValueError(
            f"prompts {tuple(prompts.shape)}, rewards {tuple(rewards.shape)} and valid_mask "
            f"{tuple(valid_mask.shape)} must share the batch dimension"
        )
    _, group_ids = torch.unique(prompts, dim=0, return_inverse=True)
    baseline = torch.zeros_like(rewards)
    std = torch.zeros_like(rewards)
    valid = valid_mask.to(rewards.dtype)
    for group in group_ids.unique():
        idx = (group_ids == group).nonzero(as_tuple=True)[0]
        group_rewards, group_valid = rewards[idx], valid[idx]
        if group_valid.sum() <= 1:
            baseline[idx] = group_rewards
            continue
        # weights[i, j] = 1 when sample j is in sample i's reference set
        weights = group_valid.unsqueeze(0).expand(len(idx), len(idx)).clone()
        if leave_one_out_baseline:
            weights.fill_diagonal_(0.0)
        count = weights.sum(dim=1)
        mean = weights @ group_rewards / count
        sq_dev = weights * (group_rewards.unsqueeze(0) - mean.unsqueeze(1)).square()
        var = sq_dev.sum(dim=1) / (count - 1).clamp(min=1)
        baseline[idx] = mean
        std[idx] = torch.where(count > 1, var.sqrt(), torch.zeros_like(var))
    return baseline, std


def calculate_global_valid_counts(data: BatchedDataDict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global_valid_seqs, global_valid_toks)`` of a whole global batch.

    Sequences: ``sample_mask.sum()``; tokens: ``(token_mask[:, 1:] * sample_mask).sum()``,
    the positions a next-token loss scores. Compute once per global batch and pass the
    same values to every microbatch's loss call.
    """
    sample_mask = data["sample_mask"]
    token_mask = data["token_mask"][:, 1:]
    valid_toks = (token_mask * sample_mask.unsqueeze(-1)).sum()
    return sample_mask.sum(), valid_toks
