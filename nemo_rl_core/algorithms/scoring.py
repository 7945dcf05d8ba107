"""The environments of a run and the rewards they give its rollouts: the reward stage of
every algorithm that generates (GRPO, PPO, distillation) and validation score through
here, sample by sample, and fail loudly when too many checks broke."""

from typing import Any

from nemo_rl_core.algorithms.grpo_config import RLMasterConfig
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.environments.utils import create_env
from nemo_rl_core.experience.rollouts import calculate_rewards, store_rewards

# ``reward_reason`` prefixes of a check that did not finish (the worker pool's outcome kinds).
ENV_FAILURE_KINDS = ("error", "timeout", "died")


class EnvironmentFailureError(RuntimeError):
    """Too many reward checks failed in one batch: the environment, not the policy, is broken."""


def make_task_to_env(config: RLMasterConfig) -> dict[str, EnvironmentInterface]:
    """One environment per ``env:`` entry, keyed by task name."""
    return {name: create_env(name, settings) for name, settings in config.env.items()}


def score_rollouts(
    batch: BatchedDataDict, task_to_env: dict[str, EnvironmentInterface], config: RLMasterConfig
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Rewards from the environments (multi-turn episodes were scored while played).

    A sample whose checker raised, timed out or died has reward 0 and the reason in its
    ``extra_env_info["reward_reason"]``; they are counted in the metrics, and past
    ``max_env_failure_fraction`` of the batch this raises ``EnvironmentFailureError``."""
    scored = score_samples(batch, task_to_env, config)
    return scored, reward_metrics(scored, config)


def score_samples(
    batch: BatchedDataDict, task_to_env: dict[str, EnvironmentInterface], config: RLMasterConfig
) -> BatchedDataDict:
    """Each sample's reward and its environment's metadata: sample by sample, so a batch
    scored in slices and joined again is the batch scored whole (the reward stage's shards)."""
    if config.algorithm.max_rollout_turns == 1:
        env_return = calculate_rewards(batch, task_to_env)
        store_rewards(batch, env_return.rewards)
        batch["extra_env_info"] = list(env_return.metadata)
    return batch


def reward_metrics(batch: BatchedDataDict, config: RLMasterConfig) -> dict[str, Any]:
    """The scored batch's reward metrics and failed checks; ``EnvironmentFailureError`` past
    ``max_env_failure_fraction``."""
    failures: dict[str, int] = dict.fromkeys(ENV_FAILURE_KINDS, 0)
    if config.algorithm.max_rollout_turns == 1:
        for meta in batch["extra_env_info"]:
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
    return {
        "mean_reward": float(rewards.mean()),
        "max_reward": float(rewards.max()),
        "fraction_positive": float((rewards > 0).float().mean()),
        **{f"env_{kind}_count": count for kind, count in failures.items()},
        "env_failed_fraction": failed_fraction,
    }
