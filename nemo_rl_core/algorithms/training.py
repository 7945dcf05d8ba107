"""One optimizer step of any algorithm on a stored batch, and the step's metrics reduced
over its microbatches as NeMo RL reduces them (GRPO, PPO, SFT, DPO, RM and distillation
all train through here)."""

from typing import Any

import torch

from nemo_rl_core.algorithms.grpo_config import RLMasterConfig
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.models.value.interfaces import ValueInterface


def train_policy(
    policy: PolicyInterface | ValueInterface,
    train_data: BatchedDataDict,
    loss_fn: Any,
    config: RLMasterConfig,
    iteration: int,
    gbs: int | None = None,
    mbs: int | None = None,
) -> dict[str, Any]:
    """One optimizer step on the iteration's batch (PPO's value model trains here too); a
    non-finite loss fails with the iteration. ``gbs``/``mbs``: the policy's own sizes
    unless given (preference pairs are two sequences each)."""
    policy.prepare_for_training()
    try:
        results = policy.train(train_data, loss_fn, gbs=gbs, mbs=mbs)
    except FloatingPointError as err:  # the policy's own NaN/Inf check does not know the step
        raise FloatingPointError(f"iteration {iteration}: {err}") from err
    finally:
        policy.finish_training()
    metrics = merge_step_metrics(results)
    bad = [
        k
        for k in ("loss", "grad_norm")
        if k in metrics and not torch.isfinite(torch.tensor(metrics[k]))
    ]
    if bad:
        raise FloatingPointError(f"iteration {iteration}: non-finite {bad} in training: {metrics}")
    return metrics


# Settings and counts every microbatch repeats: NeMo RL logs their mean.
_REPEATED_METRICS = frozenset({"lr", "wd", "global_valid_seqs", "global_valid_toks"})


def merge_step_metrics(results: dict[str, Any]) -> dict[str, float]:
    """One number per metric of a training step, reduced over its microbatches as NeMo RL's
    ``grpo_train`` does: the loss's metrics are shares of the global batch's (normalised
    by its valid tokens or sequences), so they add up; ``*_min``/``*_max`` take the
    extreme of the finite values (-1 if none: every microbatch was empty); settings and
    counts each microbatch repeats take the mean."""
    per_microbatch = {
        "loss": results["loss"],
        "grad_norm": results["grad_norm"],
        **results.get("all_mb_metrics", {}),
    }
    merged: dict[str, float] = {}
    for key, values in per_microbatch.items():
        flat = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        if flat.numel() == 0:
            continue
        if key.endswith(("_min", "_max")):
            finite = flat[torch.isfinite(flat)]
            if finite.numel() == 0:
                merged[key] = -1.0
            else:
                merged[key] = float(finite.min() if key.endswith("_min") else finite.max())
        elif key in _REPEATED_METRICS:
            merged[key] = float(flat.mean())
        else:
            merged[key] = float(flat.sum())
    return merged
