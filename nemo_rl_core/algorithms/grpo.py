"""GRPO (NeMo RL's ``nemo_rl.algorithms.grpo``): the work of each stage, and its config
classes by NeMo RL's names (they live in :mod:`~nemo_rl_core.algorithms.grpo_config`).

NeMo RL runs these steps inside one long ``grpo_train`` loop; here each is a pure function
that a Prefect task (``tasks/``) or a plain loop can call, so one stage of one iteration
can be recomputed alone from its stored inputs.
"""

import time
from collections.abc import Iterable
from typing import Any

import torch

from nemo_rl_core.algorithms.advantage_estimator import (
    GDPOAdvantageEstimator,
    GRPOAdvantageEstimator,
    ReinforcePlusPlusAdvantageEstimator,
    create_advantage_estimator,
)
from nemo_rl_core.algorithms.config import GRPOAdvantageConfig
from nemo_rl_core.algorithms.filters import (
    accumulate_dynamic_sampling_batch,
    apply_overlong_filtering,
    dynamic_sampling_filter,
)

# NeMo RL names the config classes here (noqa: re-exported); they live apart so that the
# config check loads no torch.
from nemo_rl_core.algorithms.grpo_config import (
    AsyncGRPOConfig,  # noqa: F401
    DataPlaneConfig,  # noqa: F401
    GRPOConfig,  # noqa: F401
    MasterConfig,
    RLMasterConfig,
    load_master_config,  # noqa: F401
)
from nemo_rl_core.algorithms.loss import ClippedPGLossFn
from nemo_rl_core.algorithms.reward_functions import (
    RewardScalingConfig,  # noqa: F401 - NeMo RL's path (nemo_rl.algorithms.grpo)
    apply_reward_shaping,
    scale_rewards,
)
from nemo_rl_core.algorithms.utils import (
    calculate_baseline_and_std_per_prompt,
    get_gdpo_reward_component_keys,
)
from nemo_rl_core.algorithms.validation import validate_batches
from nemo_rl_core.data.llm_message_utils import (
    message_logs_to_train_data,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.models.generation.interfaces import GenerationInterface
from nemo_rl_core.models.policy.interfaces import PolicyInterface


def build_loss_fn(config: RLMasterConfig) -> ClippedPGLossFn:
    return ClippedPGLossFn(config.loss_fn)


class DynamicSamplingExhaustedError(RuntimeError):
    """Dynamic sampling generated its maximum number of batches without filling one."""


def select_prompt_groups(
    batch: BatchedDataDict,
    kept_before: BatchedDataDict | None,
    config: RLMasterConfig,
    round_index: int,
) -> tuple[BatchedDataDict, bool, dict[str, Any]]:
    """DAPO's dynamic sampling, as NeMo RL does it: keep the samples whose prompt group's
    rewards vary (per-sample std > 0; the unshaped rewards when shaping is on), after
    those kept in earlier rounds. Complete at ``num_prompts_per_step x
    num_generations_per_prompt`` samples (cut to that); else another round generates more,
    until ``dynamic_sampling_max_gen_batches`` batches were processed."""
    loop = config.algorithm
    key = "unshaped_total_reward" if "unshaped_total_reward" in batch else "total_reward"
    rewards = batch[key]
    # ppo: has no leave-one-out key (its baseline is the value model): the plain group std.
    leave_one_out = isinstance(loop, GRPOAdvantageConfig) and loop.use_leave_one_out_baseline
    _, std = calculate_baseline_and_std_per_prompt(
        batch["prompt_index"], rewards, torch.ones_like(rewards), leave_one_out
    )
    filtered, metrics = dynamic_sampling_filter(batch, std)
    target = loop.num_prompts_per_step * loop.num_generations_per_prompt
    selected, complete = accumulate_dynamic_sampling_batch(kept_before, filtered, target)
    batches_done = round_index + 1
    if not complete and batches_done > loop.dynamic_sampling_max_gen_batches:
        raise DynamicSamplingExhaustedError(
            f"dynamic sampling processed {batches_done} generation batches and kept "
            f"{selected.size} of the {target} samples a step needs (grpo."
            f"dynamic_sampling_max_gen_batches={loop.dynamic_sampling_max_gen_batches}); "
            "the prompts are too easy or too hard for the policy: raise the limit, "
            "grpo.batch_multiplier or num_generations_per_prompt"
        )
    metrics |= {
        "dynamic_sampling_num_gen_batches": batches_done,
        "dynamic_sampling_kept_total": selected.size,
    }
    if complete:
        metrics["dynamic_sampling_num_discarded_valid_samples"] = (
            filtered.size + (kept_before.size if kept_before else 0) - target
        )
    return selected, complete, metrics


def validate(
    policy_generation: GenerationInterface,
    val_dataloader: Iterable[BatchedDataDict],
    tokenizer: Any,
    val_task_to_env: dict[str, EnvironmentInterface],
    step: int,
    master_config: RLMasterConfig,
    logger: Any = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """NeMo RL's validation: the weights ``policy_generation`` holds, on at most
    ``max_val_samples`` prompts of ``val_dataloader`` (``val_batch_size`` per batch); returns
    ``(val_metrics, timing_metrics)``. ``logger`` gets the metrics under ``validation``."""
    started = time.perf_counter()
    _, metrics = validate_batches(
        policy_generation, val_dataloader, tokenizer, val_task_to_env, master_config, step
    )
    if logger is not None:
        logger.log_metrics(metrics, step, prefix="validation")
    return metrics, {"total_validation_time": time.perf_counter() - started}


def process_rewards(
    batch: BatchedDataDict, config: RLMasterConfig
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """What NeMo RL does to scored rollouts before the advantages, in its order: scale the
    rewards (``reward_scaling``), shape them (``reward_shaping``: DAPO's overlong penalty
    or the stop-properly penalty; the unshaped rewards are kept for dynamic sampling), and
    take truncated responses out of the loss (``overlong_filtering``: their
    ``loss_multiplier`` becomes 0)."""
    loop = config.algorithm
    metrics: dict[str, Any] = {}
    batch = scale_rewards(batch, loop.reward_scaling)
    if loop.reward_shaping.enabled:
        batch = apply_reward_shaping(batch, loop.reward_shaping)
    if loop.reward_scaling.enabled or loop.reward_shaping.enabled:
        # the stored total_reward the advantages use (``mean_reward``: the environments')
        metrics["mean_total_reward"] = float(batch["total_reward"].mean())
    if loop.overlong_filtering:
        multiplier = torch.as_tensor(batch["loss_multiplier"], dtype=torch.float32)
        batch["loss_multiplier"] = apply_overlong_filtering(multiplier, batch["truncated"])
        metrics["overlong_filtered_fraction"] = float(
            torch.as_tensor(batch["truncated"]).float().mean()
        )
    return batch, metrics


def compute_logprobs(
    policy: PolicyInterface, batch: BatchedDataDict, tokenizer: Any, config: RLMasterConfig
) -> BatchedDataDict:
    """Flat training inputs of the rollouts with the policy's and reference's logprobs."""
    train_data = logprob_inputs(batch, tokenizer, config)
    train_data.update(policy_logprobs(policy, train_data, config))
    return train_data


def logprob_inputs(
    batch: BatchedDataDict, tokenizer: Any, config: RLMasterConfig
) -> BatchedDataDict:
    """The flat training inputs of the scored rollouts (padded to the batch's longest)."""
    train_data = message_logs_to_train_data(
        batch["message_log"],
        pad_token_id=tokenizer.pad_token_id,
        make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
    )
    train_data["sample_mask"] = torch.as_tensor(batch["loss_multiplier"], dtype=torch.float32)
    for key in ["total_reward", *get_gdpo_reward_component_keys(batch)]:
        train_data[key] = batch[key]
    train_data["prompt_index"] = batch["prompt_index"]
    return train_data


def policy_logprobs(
    policy: PolicyInterface, train_data: BatchedDataDict, config: RLMasterConfig
) -> BatchedDataDict:
    """``prev_logprobs`` and ``reference_policy_logprobs`` of the training inputs.

    As in NeMo RL, each forward is skipped when its output is unused, and stored as zeros
    so the stage's columns stay the same: ``prev_logprobs`` with
    ``loss_fn.force_on_policy_ratio`` (the loss takes the current logprobs, detached),
    the reference's with ``skip_reference_policy_logprobs_calculation`` (KL penalty 0);
    the config validation refuses the combinations that would read them."""
    skipped = torch.zeros_like(train_data["generation_logprobs"])
    logprobs: BatchedDataDict = BatchedDataDict()
    if config.loss_fn.force_on_policy_ratio:
        logprobs["prev_logprobs"] = skipped
    else:
        logprobs["prev_logprobs"] = policy.get_logprobs(train_data)["logprobs"]
    if config.algorithm.skip_reference_policy_logprobs_calculation:
        logprobs["reference_policy_logprobs"] = skipped.clone()
    else:
        logprobs["reference_policy_logprobs"] = policy.get_reference_policy_logprobs(train_data)[
            "reference_logprobs"
        ]
    return logprobs


def compute_advantages(
    train_data: BatchedDataDict, config: MasterConfig
) -> tuple[BatchedDataDict, dict]:
    """Per-prompt baselines and the advantage of every token (GRPO / GDPO / Reinforce++)."""
    estimator = create_advantage_estimator(config.grpo.resolved_adv_estimator(), config.loss_fn)
    if not isinstance(
        estimator,
        GRPOAdvantageEstimator | GDPOAdvantageEstimator | ReinforcePlusPlusAdvantageEstimator,
    ):
        raise ValueError(
            f"grpo.adv_estimator: {type(estimator).__name__} needs a value model; "
            "GRPO takes grpo, gdpo or reinforce_plus_plus"
        )
    device = "cuda" if config.grpo.calculate_advantages_on_gpu else "cpu"
    components = get_gdpo_reward_component_keys(train_data)
    advantages = estimator.compute_advantage(
        prompt_ids=train_data["prompt_index"].to(device),
        rewards=train_data["total_reward"].to(device),
        mask=train_data["token_mask"].to(device),
        logprobs_policy=train_data["prev_logprobs"].to(device),
        logprobs_reference=train_data["reference_policy_logprobs"].to(device),
        repeated_batch={key: train_data[key].to(device) for key in components},
    )
    train_data["advantages"] = clip_advantages(advantages.cpu(), config.grpo)
    metrics = mask_by_sequence_logprob_error(train_data, config.grpo.seq_logprob_error_threshold)
    baseline, std = calculate_baseline_and_std_per_prompt(
        train_data["prompt_index"],
        train_data["total_reward"],
        torch.ones_like(train_data["total_reward"]),
    )
    return train_data, {
        **metrics,
        "mean_baseline": float(baseline.mean()),
        "mean_reward_std": float(std.mean()),
        **advantage_metrics(train_data, baseline),
    }


def advantage_metrics(train_data: BatchedDataDict, baseline: torch.Tensor) -> dict[str, float]:
    """NeMo RL's per-step view of the advantages (over response tokens), of the groups'
    baselines (the share, in percent, of samples whose group always or never scored 1)
    and of the tokens in the batch (prompts and responses)."""
    response = train_data["advantages"][train_data["token_mask"].bool()].float()
    pct_0 = 100 * float((baseline == 0).float().mean())
    pct_1 = 100 * float((baseline == 1).float().mean())
    empty = response.numel() == 0
    return {
        "advantages/mean": 0.0 if empty else float(response.mean()),
        "advantages/max": 0.0 if empty else float(response.max()),
        "advantages/min": 0.0 if empty else float(response.min()),
        "advantages/sum": float(response.sum()),
        "baseline_reward/pct_0": pct_0,
        "baseline_reward/pct_1": pct_1,
        "baseline_reward/pct_mixed": 100 - pct_0 - pct_1,
        "total_num_tokens": float(train_data["input_lengths"].sum()),
    }


def mask_by_sequence_logprob_error(
    train_data: BatchedDataDict, threshold: float | None
) -> dict[str, float]:
    """How far the trainer's probabilities of each sampled sequence are from the generator's
    (NeMo RL's per-sequence token_mult_prob_error: the mean over its tokens of
    exp|log pi_gen - log pi_old|); with ``threshold``, sequences above it leave the loss
    (their ``sample_mask`` becomes 0)."""
    token_mask = train_data["token_mask"][:, 1:]
    sample_mask = train_data["sample_mask"].to(torch.float32)
    error = (train_data["generation_logprobs"] - train_data["prev_logprobs"])[:, 1:].abs()
    mask = token_mask * sample_mask.unsqueeze(-1)
    counts = mask.sum(-1)
    valid = counts > 0
    per_sequence = ((error * mask).exp() * mask).sum(-1) / counts.clamp(min=1)

    def spread(values: torch.Tensor, prefix: str) -> dict[str, float]:
        empty = values.numel() == 0
        return {
            f"max_{prefix}": 0.0 if empty else values.max().item(),
            f"mean_{prefix}": 0.0 if empty else values.mean().item(),
            f"min_{prefix}": 0.0 if empty else values.min().item(),
        }

    metrics = spread(per_sequence[valid], "seq_mult_prob_error")
    if threshold is None:
        return metrics
    kept = (per_sequence <= threshold).float() * sample_mask
    dropped = (sample_mask - kept).bool()
    rewards = train_data["total_reward"].reshape(-1)
    train_data["sample_mask"] = kept
    return {
        **metrics,
        **spread(per_sequence[kept.bool() & valid], "seq_mult_prob_error_after_mask"),
        "num_masked_seqs_by_logprob_error": int(dropped.sum()),
        "masked_correct_pct": float((rewards[dropped] == 1).float().mean())
        if dropped.any()
        else 0.0,
    }


def clip_advantages(advantages: torch.Tensor, loop: GRPOAdvantageConfig) -> torch.Tensor:
    """Clamp to [``advantage_clip_low``, ``advantage_clip_high``] (either may be None): a
    tiny group std can blow the normalized advantages up."""
    low, high = loop.advantage_clip_low, loop.advantage_clip_high
    if low is None and high is None:
        return advantages
    return advantages.clamp(min=low, max=high)
