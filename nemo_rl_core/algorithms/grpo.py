"""GRPO (NeMo RL's ``nemo_rl.algorithms.grpo``): its config and the work of each stage.

NeMo RL runs these steps inside one long ``grpo_train`` loop; here each is a pure function
that a Prefect task (``tasks/``) or a plain loop can call, so one stage of one iteration
can be recomputed alone from its stored inputs.
"""

import hashlib
import json
from abc import abstractmethod
from typing import Any, Self

import torch
from pydantic import Field, model_validator

from nemo_rl_core.algorithms.advantage_estimator import create_advantage_estimator
from nemo_rl_core.algorithms.config import ClippedPGLossConfig, GRPOAdvantageConfig, StrictConfig
from nemo_rl_core.algorithms.loss import ClippedPGLossFn
from nemo_rl_core.algorithms.utils import calculate_baseline_and_std_per_prompt
from nemo_rl_core.data.config import DataConfig
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import build_dataset
from nemo_rl_core.data.llm_message_utils import (
    batched_message_log_to_flat_message,
    message_logs_to_train_data,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.distributed.virtual_cluster import ClusterConfig
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.environments.utils import create_env
from nemo_rl_core.experience.rollouts import (
    calculate_rewards,
    generate_responses,
    run_multi_turn_rollout,
)
from nemo_rl_core.models.generation.interfaces import GenerationInterface
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.utils.checkpoint import CheckpointingConfig
from nemo_rl_core.utils.config import load_config_with_overrides, validate_config
from nemo_rl_core.utils.logger import LoggerConfig

# ``reward_reason`` prefixes of a check that did not finish (the worker pool's outcome kinds).
ENV_FAILURE_KINDS = ("error", "timeout", "died")


class EnvironmentFailureError(RuntimeError):
    """Too many reward checks failed in one batch: the environment, not the policy, is broken."""


class RolloutLoopConfig(StrictConfig):
    """The loop keys ``grpo:`` and ``ppo:`` share (NeMo RL's names and defaults): how many
    prompts and samples per step, how many steps, the seed."""

    num_prompts_per_step: int = Field(ge=1)
    num_generations_per_prompt: int = Field(1, ge=1)
    max_rollout_turns: int = Field(1, ge=1)
    max_num_epochs: int = Field(1, ge=1)
    max_num_steps: int = Field(ge=1)
    val_period: int = Field(0, ge=0)
    val_batch_size: int | None = None
    val_at_start: bool = False
    max_val_samples: int | None = None
    seed: int = 42
    skip_reference_policy_logprobs_calculation: bool = False
    # Not in NeMo RL: a reward checker that raised, hung or died gives reward 0; past this
    # fraction of the batch the reward stage fails instead of training on broken rewards.
    max_env_failure_fraction: float = Field(0.5, ge=0.0, le=1.0)


class GRPOConfig(GRPOAdvantageConfig, RolloutLoopConfig):
    """``grpo:``: NeMo RL's keys and defaults (advantage and loop keys inherited)."""

    num_generations_per_prompt: int = Field(ge=1)
    reward_scaling: dict[str, Any] = Field(default_factory=dict)
    async_grpo: dict[str, Any] = Field(default_factory=dict)


class RLMasterConfig(StrictConfig):
    """The sections every on-policy algorithm's YAML shares; ``algorithm`` is its own
    section (``grpo:``, ``ppo:``), which the shared stage functions read."""

    loss_fn: ClippedPGLossConfig = Field(default_factory=ClippedPGLossConfig)
    policy: PolicyConfig
    data: DataConfig
    env: dict[str, dict[str, Any]] = Field(default_factory=dict)
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    @property
    @abstractmethod
    def algorithm(self) -> RolloutLoopConfig: ...

    def algorithm_max_steps(self) -> int:
        return self.algorithm.max_num_steps

    @model_validator(mode="after")
    def _skipped_forwards_are_unused(self) -> Self:
        """NeMo RL's checks of the two forward shortcuts of the logprob stage: each is
        exact only when nothing reads what it no longer computes."""
        loop, loss = self.algorithm, self.loss_fn
        section = type(loop).__name__.removesuffix("Config").lower()
        if loss.force_on_policy_ratio:
            samples = loop.num_prompts_per_step * loop.num_generations_per_prompt
            if self.policy.train_global_batch_size != samples:
                raise ValueError(
                    "loss_fn.force_on_policy_ratio needs one optimizer step per batch: "
                    f"policy.train_global_batch_size={self.policy.train_global_batch_size} "
                    f"must equal {section}.num_prompts_per_step x num_generations_per_prompt"
                    f" = {samples}"
                )
            if loss.use_kl_in_reward and loss.reference_policy_kl_penalty != 0:
                raise ValueError(
                    "loss_fn.force_on_policy_ratio skips the policy forward whose "
                    "prev_logprobs loss_fn.use_kl_in_reward reads for its KL reward; "
                    "set one of them to false"
                )
        if loop.skip_reference_policy_logprobs_calculation and loss.reference_policy_kl_penalty:
            raise ValueError(
                f"{section}.skip_reference_policy_logprobs_calculation needs "
                "loss_fn.reference_policy_kl_penalty: 0 "
                f"(got {loss.reference_policy_kl_penalty}): the KL term reads them"
            )
        return self


class MasterConfig(RLMasterConfig):
    """The whole YAML of a GRPO run."""

    grpo: GRPOConfig

    @property
    def algorithm(self) -> GRPOConfig:
        return self.grpo


def load_master_config(
    config_path: str,
    overrides: list[str] | None = None,
    config_class: type[RLMasterConfig] = MasterConfig,
) -> RLMasterConfig:
    """Load, override and validate a GRPO YAML (or ``config_class``'s, e.g. PPO's); errors
    name the file or the key path."""
    raw = load_config_with_overrides(config_path, overrides)
    return validate_config(config_class, raw, source=f"config {config_path}")


def digest_json(value: Any) -> str:
    """A stable digest of JSON-able data (configs, dataloader states)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def make_task_to_env(config: RLMasterConfig) -> dict[str, EnvironmentInterface]:
    """One environment per ``env:`` entry, keyed by task name."""
    return {name: create_env(name, settings) for name, settings in config.env.items()}


def build_loss_fn(config: RLMasterConfig) -> ClippedPGLossFn:
    return ClippedPGLossFn(config.loss_fn)


def make_dataloader(config: RLMasterConfig, tokenizer: Any) -> StatefulDataLoader:
    """The training dataloader: ``num_prompts_per_step`` prompts per iteration."""
    return StatefulDataLoader(
        build_dataset(config.data, tokenizer),
        batch_size=config.algorithm.num_prompts_per_step,
        shuffle=config.data.shuffle,
        seed=config.data.seed,
        drop_last=config.data.drop_last,
    )


def take_prompts(
    dataloader: StatefulDataLoader, config: RLMasterConfig, dataloader_state: dict
) -> tuple[BatchedDataDict, dict]:
    """The prompts after ``dataloader_state``, each repeated ``num_generations_per_prompt``
    times, and the dataloader state after taking them."""
    dataloader.load_state_dict(dataloader_state)
    batch = dataloader.next_batch()
    generations = config.algorithm.num_generations_per_prompt
    repeated = batch.repeat_interleave(generations)
    repeated["prompt_index"] = torch.arange(batch.size).repeat_interleave(generations)
    return repeated, dataloader.state_dict()


def generate_rollouts(
    generation: GenerationInterface,
    batch: BatchedDataDict,
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    config: RLMasterConfig,
    iteration: int,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Responses for every prompt; multi-turn tasks play the whole episode here."""
    max_seq_len = config.policy.max_total_sequence_length
    generation.prepare_for_generation()
    try:
        seeds = sampling_seeds(config.algorithm.seed, iteration, batch.size)
        if config.algorithm.max_rollout_turns > 1:
            batch = BatchedDataDict({**batch})
            return run_multi_turn_rollout(
                generation,
                batch,
                tokenizer,
                task_to_env,
                max_seq_len,
                config.algorithm.max_rollout_turns,
            )
        return generate_one_turn(generation, batch, tokenizer, seeds)
    finally:
        generation.finish_generation()


def sampling_seeds(seed: int, iteration: int, size: int) -> torch.Tensor:
    """Per-sample seeds of one iteration: a rerun or resumed stage samples the same tokens."""
    base = (seed * 1_000_003 + iteration * 10_007) % (2**31 - size)
    return torch.arange(base, base + size, dtype=torch.int64)


def generate_one_turn(
    generation: GenerationInterface, batch: BatchedDataDict, tokenizer: Any, seeds: torch.Tensor
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """One assistant turn per sample, left unscored: the reward stage asks the environments."""
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    flat, input_lengths = batched_message_log_to_flat_message(
        batch["message_log"], pad_value_dict={"token_ids": pad_id}
    )
    generation_input = BatchedDataDict(
        {"input_ids": flat["token_ids"], "input_lengths": input_lengths, "sample_seeds": seeds}
    )
    batch, _, metrics = generate_responses(
        generation, generation_input, batch, tokenizer, input_lengths
    )
    return batch, metrics


def score_rollouts(
    batch: BatchedDataDict, task_to_env: dict[str, EnvironmentInterface], config: RLMasterConfig
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Rewards from the environments (multi-turn episodes were scored while played).

    A sample whose checker raised, timed out or died has reward 0 and the reason in its
    ``extra_env_info["reward_reason"]``; they are counted in the metrics, and past
    ``max_env_failure_fraction`` of the batch this raises ``EnvironmentFailureError``."""
    failures: dict[str, int] = dict.fromkeys(ENV_FAILURE_KINDS, 0)
    if config.algorithm.max_rollout_turns == 1:
        env_return = calculate_rewards(batch, task_to_env)
        batch["total_reward"] = env_return.rewards.to(torch.float32)
        batch["extra_env_info"] = list(env_return.metadata)
        for meta in env_return.metadata:
            kind = str((meta or {}).get("reward_reason", "")).split(":", 1)[0]
            if kind in failures:
                failures[kind] += 1
    rewards = batch["total_reward"]
    failed_fraction = sum(failures.values()) / max(len(rewards), 1)
    if failed_fraction > config.algorithm.max_env_failure_fraction:
        raise EnvironmentFailureError(
            f"{sum(failures.values())} of {len(rewards)} reward checks failed ({failures}), "
            f"more than max_env_failure_fraction={config.algorithm.max_env_failure_fraction}"
        )
    return batch, {
        "mean_reward": float(rewards.mean()),
        "max_reward": float(rewards.max()),
        "fraction_positive": float((rewards > 0).float().mean()),
        **{f"env_{kind}_count": count for kind, count in failures.items()},
        "env_failed_fraction": failed_fraction,
    }


def compute_logprobs(
    policy: PolicyInterface, batch: BatchedDataDict, tokenizer: Any, config: RLMasterConfig
) -> BatchedDataDict:
    """Flat training inputs of the rollouts with the policy's and reference's logprobs.

    As in NeMo RL, each forward is skipped when its output is unused, and stored as zeros
    so the stage's columns stay the same: ``prev_logprobs`` with
    ``loss_fn.force_on_policy_ratio`` (the loss takes the current logprobs, detached),
    the reference's with ``skip_reference_policy_logprobs_calculation`` (KL penalty 0);
    the config validation refuses the combinations that would read them."""
    train_data = message_logs_to_train_data(
        batch["message_log"],
        pad_token_id=tokenizer.pad_token_id,
        make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
    )
    train_data["sample_mask"] = torch.as_tensor(batch["loss_multiplier"], dtype=torch.float32)
    train_data["total_reward"] = batch["total_reward"]
    train_data["prompt_index"] = batch["prompt_index"]
    skipped = torch.zeros_like(train_data["generation_logprobs"])
    if config.loss_fn.force_on_policy_ratio:
        train_data["prev_logprobs"] = skipped
    else:
        train_data["prev_logprobs"] = policy.get_logprobs(train_data)["logprobs"]
    if config.algorithm.skip_reference_policy_logprobs_calculation:
        train_data["reference_policy_logprobs"] = skipped.clone()
    else:
        train_data["reference_policy_logprobs"] = policy.get_reference_policy_logprobs(train_data)[
            "reference_logprobs"
        ]
    return train_data


def compute_advantages(
    train_data: BatchedDataDict, config: MasterConfig
) -> tuple[BatchedDataDict, dict]:
    """Per-prompt baselines and the advantage of every token (GRPO / Reinforce++)."""
    estimator = create_advantage_estimator(config.grpo.resolved_adv_estimator(), config.loss_fn)
    advantages = estimator.compute_advantage(
        prompt_ids=train_data["prompt_index"],
        rewards=train_data["total_reward"],
        mask=train_data["token_mask"],
        logprobs_policy=train_data["prev_logprobs"],
        logprobs_reference=train_data["reference_policy_logprobs"],
    )
    train_data["advantages"] = advantages
    baseline, std = calculate_baseline_and_std_per_prompt(
        train_data["prompt_index"],
        train_data["total_reward"],
        torch.ones_like(train_data["total_reward"]),
    )
    return train_data, {
        "mean_baseline": float(baseline.mean()),
        "mean_reward_std": float(std.mean()),
    }


def train_policy(
    policy: PolicyInterface,
    train_data: BatchedDataDict,
    loss_fn: Any,
    config: RLMasterConfig,
    iteration: int,
) -> dict[str, Any]:
    """One optimizer step on the iteration's batch; a non-finite loss fails with the iteration."""
    policy.prepare_for_training()
    try:
        results = policy.train(train_data, loss_fn)
    except FloatingPointError as err:  # the policy's own NaN/Inf check does not know the step
        raise FloatingPointError(f"iteration {iteration}: {err}") from err
    finally:
        policy.finish_training()
    metrics = {k: _scalar(v) for k, v in results.items() if _scalar(v) is not None}
    bad = [
        k
        for k in ("loss", "grad_norm")
        if k in metrics and not torch.isfinite(torch.tensor(metrics[k]))
    ]
    if bad:
        raise FloatingPointError(f"iteration {iteration}: non-finite {bad} in training: {metrics}")
    return metrics


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return None
