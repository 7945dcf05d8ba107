"""PPO with a value model (NeMo RL's ``ppo:`` recipe): the stages it adds, and its config
classes (they live in :mod:`~nemo_rl_core.algorithms.ppo_config`).

PPO shares GRPO's rollout stages (prompts, generate, reward, logprob: the functions of
:mod:`nemo_rl_core.algorithms.grpo`, which read ``config.algorithm``) and adds three
steps: the value model's estimates of the rollout, GAE advantages and returns from them,
and a value update next to the policy update.
"""

from typing import Any

import torch

from nemo_rl_core.algorithms.advantage_estimator import create_advantage_estimator
from nemo_rl_core.algorithms.loss import MseValueLossFn

# NeMo RL names the config classes here (noqa: re-exported); they live apart so that the
# config check loads no torch.
from nemo_rl_core.algorithms.ppo_config import PPOConfig, PPOMasterConfig  # noqa: F401
from nemo_rl_core.algorithms.training import train_policy
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.models.value import ValueInterface

MasterConfig = PPOMasterConfig  # NeMo RL's name for it in this module


def compute_values(value_model: ValueInterface, train_data: BatchedDataDict) -> BatchedDataDict:
    """The rollout's training inputs with the value model's ``values`` [B, S] (V_t of the
    state before token t): the old values GAE and the clipped value loss start from."""
    value_model.prepare_for_inference()
    train_data["values"] = value_model.get_values(train_data)["values"]
    return train_data


def compute_advantages(
    train_data: BatchedDataDict, config: PPOMasterConfig
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """``advantages`` and the value model's targets ``returns`` (GAE; the raw reward with
    ``adv_estimator.name: raw_reward``, whose returns are the rewards); with
    ``loss_fn.use_kl_in_reward`` the per-token KL to the reference is part of the reward."""
    estimator = create_advantage_estimator(config.ppo.adv_estimator, config.loss_fn)
    device = "cuda" if config.ppo.calculate_advantages_on_gpu else "cpu"
    mask = train_data["token_mask"].to(torch.float32)
    values = train_data["values"].to(torch.float32)
    advantages, returns = estimator.compute_advantage(
        prompt_ids=train_data["prompt_index"].to(device),
        rewards=train_data["total_reward"].to(device, torch.float32),
        mask=mask.to(device),
        values=values.to(device),
        logprobs=train_data["prev_logprobs"].to(device),
        reference_logprobs=train_data["reference_policy_logprobs"].to(device),
    )
    if returns is None:
        returns = advantages.clone()
    train_data["advantages"] = advantages.cpu()
    train_data["returns"] = returns.cpu()
    return train_data, {
        "mean_returns": float(masked_mean(train_data["returns"], mask)),
        "mean_values": float(masked_mean(values, mask)),
    }


def update_policy_and_value(
    policy: PolicyInterface,
    value_model: ValueInterface,
    train_data: BatchedDataDict,
    policy_loss_fn: Any,
    config: PPOMasterConfig,
    iteration: int,
) -> dict[str, Any]:
    """NeMo RL's PPO update: ``ppo_epochs`` passes over the batch, each training the value
    model (critic first) and then the policy, the policy only from step
    ``policy_training_start_step`` on (critic warm-up). Metrics are the last pass's; the
    value model's are prefixed ``value_``."""
    value_loss_fn = MseValueLossFn(config.value_loss_fn)
    metrics: dict[str, Any] = {}
    train_the_policy = iteration >= config.ppo.policy_training_start_step
    for _ in range(config.ppo.ppo_epochs):
        value_metrics = train_policy(value_model, train_data, value_loss_fn, config, iteration)
        metrics = {f"value_{name}": value for name, value in value_metrics.items()}
        if train_the_policy:
            metrics |= train_policy(policy, train_data, policy_loss_fn, config, iteration)
    metrics["policy_trained"] = float(train_the_policy)
    return metrics
