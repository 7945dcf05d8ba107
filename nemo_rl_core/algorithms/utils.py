"""Shared math of the algorithms (``nemo_rl.algorithms.utils``): masked means, KL
estimators, per-prompt baselines.

Every loss normalizes through :func:`masked_mean` with a *global* normalization factor,
which is what makes microbatch losses sum exactly to the full-batch loss.
"""

import copy
import math
import random
import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch

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
    normalization_factor: torch.Tensor | float
    if global_normalization_factor is None:
        normalization_factor = mask.sum(dim=dim)
    else:
        normalization_factor = global_normalization_factor
    return (values * mask).sum(dim=dim) / (normalization_factor + 1e-8)


def masked_var(
    values: torch.Tensor,
    mask: torch.Tensor,
    mean: torch.Tensor | float | None = None,
    unbiased: bool = True,
) -> torch.Tensor:
    """Variance of the masked values around ``mean`` (their masked mean by default), with
    Bessel's correction when ``unbiased``."""
    if mean is None:
        mean = masked_mean(values, mask)
    variance = masked_mean((values - mean).pow(2), mask)
    if unbiased:
        count = mask.sum()
        variance = variance * (count / (count - 1))
    return variance


def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: KLType = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
    importance_sampling_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimator of KL(pi || pi_ref) from samples of pi (Schulman 2020).

    With ``r = log pi_ref - log pi`` (clamped to ``+-input_clamp_value``):
    k1 = -r, k2 = r^2 / 2, k3 = exp(r) - 1 - r; times ``importance_sampling_weights``
    when given (a weight whose token's r was clamped is detached, so the clamp stops both
    gradients); the result is clamped to ``+-output_clamp_value``. Clamps keep one wild
    token from dominating the batch.
    """
    logr = logprobs_reference - logprobs
    if input_clamp_value is not None:
        clamped = logr.clamp(min=-input_clamp_value, max=input_clamp_value)
        if importance_sampling_weights is not None:
            importance_sampling_weights = torch.where(
                clamped == logr, importance_sampling_weights, importance_sampling_weights.detach()
            )
        logr = clamped
    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k2":
        kl = logr.square() / 2
    elif kl_type == "k3":
        kl = torch.exp(logr) - 1 - logr
    else:
        raise ValueError(f"Invalid KL type: {kl_type!r} (use 'k1', 'k2' or 'k3')")
    if importance_sampling_weights is not None:
        kl = importance_sampling_weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)
    return kl


def calculate_baseline_and_std_per_prompt(
    prompts: torch.Tensor,
    rewards: torch.Tensor,
    valid_mask: torch.Tensor,
    leave_one_out_baseline: bool = True,
    std_rewards: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline and std of the rewards of its prompt's group.

    Samples with identical rows in ``prompts`` ([B, P] token ids, or [B] group ids) form a
    group with n valid samples. With leave-one-out, sample i's reference set is the group's
    valid samples other than i, and both sums are divided by k = n - 1 (NeMo RL's choice,
    also for an invalid sample, which is in no reference set); without it k = n. Then
    baseline_i = sum(r) / k, std_i = sqrt((sum(s^2) / k - (sum(s) / k)^2) * k / (k - 1))
    (0 where undefined), with s = ``std_rewards`` (DAPO: the unshaped rewards) or r. A
    group with at most one valid sample gets baseline = reward and std = 0: its
    advantages are zero.
    """
    if prompts.dim() == 1:
        prompts = prompts.unsqueeze(-1)
    if prompts.shape[0] != rewards.shape[0] or valid_mask.shape != rewards.shape:
        raise ValueError(
            f"prompts {tuple(prompts.shape)}, rewards {tuple(rewards.shape)} and valid_mask "
            f"{tuple(valid_mask.shape)} must share the batch dimension"
        )
    spread = rewards if std_rewards is None else std_rewards
    _, group_ids = torch.unique(prompts, dim=0, return_inverse=True)
    group_ids = group_ids.to(rewards.device)
    baseline = torch.zeros_like(rewards)
    std = torch.zeros_like(rewards)
    valid = valid_mask.to(device=rewards.device, dtype=rewards.dtype)
    for group in group_ids.unique():
        idx = (group_ids == group).nonzero(as_tuple=True)[0]
        group_valid = valid[idx]
        if group_valid.sum() <= 1:
            baseline[idx] = rewards[idx]
            continue
        size = len(idx)
        # reference[i, j] = 1 when sample j counts toward sample i's statistics
        reference = torch.ones(size, size, dtype=rewards.dtype, device=rewards.device)
        if leave_one_out_baseline:
            reference -= torch.eye(size, dtype=rewards.dtype, device=rewards.device)
        k = group_valid.sum() - int(leave_one_out_baseline)
        baseline[idx] = reference @ (rewards[idx] * group_valid) / k
        spread_mean = (
            baseline[idx] if std_rewards is None else reference @ (spread[idx] * group_valid) / k
        )
        spread_sq_mean = reference @ (spread[idx].square() * group_valid) / k
        variance = (spread_sq_mean - spread_mean.square()) * (k / (k - 1))
        std[idx] = variance.sqrt().nan_to_num(0.0)
    return baseline, std


def get_gdpo_reward_component_keys(batch: Mapping[str, Any]) -> list[str]:
    """The batch's per-component reward keys (``reward1``, ``reward2``, ...), in component
    order: a multi-reward environment's rewards, which GDPO normalises one by one."""
    keys = [str(key) for key in batch if re.fullmatch(r"reward\d+", str(key))]
    return sorted(keys, key=lambda key: int(key.removeprefix("reward")))


def calculate_global_valid_counts(data: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global_valid_seqs, global_valid_toks)`` of a whole global batch: the one loss
    normaliser every training backend uses.

    Sequences: ``sample_mask.sum()`` (all samples without one); tokens: the next-token
    positions a loss scores, ``(token_mask[:, 1:] * sample_mask).sum()``, every position
    after the first when there is no ``token_mask``. Compute once per global batch and
    pass the same values to every microbatch's loss call.
    """
    reference = data["token_mask"] if "token_mask" in data else data["input_ids"]
    if "sample_mask" in data:
        sample_mask = data["sample_mask"].float()
    else:
        sample_mask = torch.ones(reference.shape[0], device=reference.device)
    if "token_mask" in data:
        token_mask = data["token_mask"][:, 1:].float()
    else:
        token_mask = torch.ones_like(reference[:, 1:], dtype=torch.float32)
    return sample_mask.sum(), (token_mask * sample_mask.unsqueeze(-1)).sum()


def get_tokenizer(tokenizer_config: Mapping[str, Any], get_processor: bool = False) -> Any:
    """NeMo RL's tokenizer from a ``tokenizer:`` section (``name`` required): the same one
    the policy loads (``chat_template`` absent or ``"default"``: the tokenizer's own;
    ``null``: the passthrough one; else a template or a ``.jinja`` file). Bad keys are
    refused naming them; a multimodal processor is not built here."""
    from pydantic import ValidationError

    from nemo_rl_core.models.policy.config import TokenizerConfig
    from nemo_rl_core.models.policy.hf_loading import build_tokenizer

    if get_processor:
        raise ValueError(
            "get_tokenizer(get_processor=True): multimodal processors are not built here; "
            "text LLMs only"
        )
    try:
        settings = TokenizerConfig.model_validate(dict(tokenizer_config))
    except ValidationError as error:
        raise ValueError(f"tokenizer: {error}") from error
    if not settings.name:
        raise ValueError("tokenizer.name: missing (the tokenizer's HF name or local path)")
    return build_tokenizer(settings, settings.name, key="tokenizer")


def set_seed(seed: int) -> None:
    """NeMo RL's seeding of a process: Python's, numpy's and torch's generators (every CUDA
    device's too; torch defers those until CUDA is initialised)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def maybe_pad_last_batch(batch: Any, dp_size: int, mbs: int) -> Any:
    """NeMo RL's padding of a last (validation) batch to a multiple of ``mbs * dp_size``
    samples, so every data-parallel rank gets whole microbatches: each field grows by
    copies of its last sample, and ``sample_mask`` by zeros, so the copies count nowhere.
    Changes ``batch`` in place and returns it."""
    if dp_size < 1 or mbs < 1:
        raise ValueError(f"maybe_pad_last_batch: dp_size={dp_size}, mbs={mbs}; both must be >= 1")
    size = batch.size
    missing = math.ceil(size / (mbs * dp_size)) * mbs * dp_size - size
    if missing == 0 or size == 0:
        return batch
    print(f"Padding last validation batch with {missing} padding samples")
    for key, value in list(batch.items()):
        if isinstance(value, torch.Tensor):
            last = torch.zeros_like(value[-1:]) if key == "sample_mask" else value[-1:]
            batch[key] = torch.cat([value, last.expand(missing, *value.shape[1:])])
        elif isinstance(value, list):
            batch[key] = value + [copy.deepcopy(value[-1]) for _ in range(missing)]
    return batch
