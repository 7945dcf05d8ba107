"""PPO with a value model (NeMo RL's ``ppo:`` recipe): its config and the stages it adds.

PPO shares GRPO's rollout stages (prompts, generate, reward, logprob: the functions of
:mod:`nemo_rl_core.algorithms.grpo`, which read ``config.algorithm``) and adds three
steps: the value model's estimates of the rollout, GAE advantages and returns from them,
and a value update next to the policy update.
"""

from typing import Any

from pydantic import Field

from nemo_rl_core.algorithms.advantage_estimator import GeneralizedAdvantageEstimator
from nemo_rl_core.algorithms.config import (
    MseValueLossConfig,
    PPOAdvantageConfig,
)
from nemo_rl_core.algorithms.grpo import RLMasterConfig, RolloutLoopConfig, train_policy
from nemo_rl_core.algorithms.loss import MseValueLossFn
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.value import ValueConfig, ValueInterface


class PPOConfig(PPOAdvantageConfig, RolloutLoopConfig):
    """``ppo:``: GAE keys (``gae_gamma``, ``gae_lambda``...) and GRPO's loop keys (with its
    reward scaling and shaping, e.g. 0/1 correctness onto -1/+1)."""


class PPOMasterConfig(RLMasterConfig):
    """The whole YAML of a PPO run: GRPO's sections plus the value model and its loss."""

    ppo: PPOConfig
    value: ValueConfig
    value_loss_fn: MseValueLossConfig = Field(default_factory=MseValueLossConfig)

    @property
    def algorithm(self) -> PPOConfig:
        return self.ppo


def compute_values(value_model: ValueInterface, train_data: BatchedDataDict) -> BatchedDataDict:
    """The rollout's training inputs with the value model's ``values`` [B, S] (V_t of the
    state before token t): the old values GAE and the clipped value loss start from."""
    value_model.prepare_for_inference()
    train_data["values"] = value_model.get_values(train_data)["values"]
    return train_data


def compute_advantages(
    train_data: BatchedDataDict, config: PPOMasterConfig
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """GAE ``advantages`` and the value model's targets ``returns`` from the (scaled)
    rewards; with ``loss_fn.use_kl_in_reward`` the per-token KL to the reference is part of
    the reward."""
    estimator = GeneralizedAdvantageEstimator(config.ppo, config.loss_fn)
    mask = train_data["token_mask"]
    advantages, returns = estimator.compute_advantages_and_returns(
        rewards=train_data["total_reward"],
        mask=mask,
        values=train_data["values"],
        logprobs_policy=train_data["prev_logprobs"],
        logprobs_reference=train_data["reference_policy_logprobs"],
    )
    train_data["advantages"] = advantages
    train_data["returns"] = returns
    mask = mask.to(returns.dtype)
    return train_data, {
        "mean_returns": float(masked_mean(returns, mask)),
        "mean_values": float(masked_mean(train_data["values"].to(returns.dtype), mask)),
    }


def train_value(
    value_model: ValueInterface,
    train_data: BatchedDataDict,
    config: PPOMasterConfig,
    iteration: int,
) -> dict[str, Any]:
    """One value-model update toward the GAE returns (:class:`MseValueLossFn`); metrics are
    prefixed ``value_`` so they sit beside the policy's in one train entry."""
    loss_fn = MseValueLossFn(config.value_loss_fn)
    metrics = train_policy(value_model, train_data, loss_fn, config, iteration)
    return {f"value_{name}": value for name, value in metrics.items()}
