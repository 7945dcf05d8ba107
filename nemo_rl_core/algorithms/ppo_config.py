"""The config of a PPO run (NeMo RL's ``ppo:`` recipe): GRPO's sections plus the value
model, apart from the work of PPO's stages (:mod:`nemo_rl_core.algorithms.ppo`, which
re-exports these names): the config check imports it without torch.
"""

from typing import Annotated, Any

from pydantic import Field, model_validator

from nemo_rl_core.algorithms.config import MseValueLossConfig, PPOAdvEstimatorConfig
from nemo_rl_core.algorithms.grpo_config import RLMasterConfig, RolloutLoopConfig
from nemo_rl_core.models.value.config import ValueConfig
from nemo_rl_core.utils.key_support import Wired

_PPO = "nemo_rl_core.algorithms.ppo"


class PPOConfig(RolloutLoopConfig):
    """``ppo:``: GRPO's loop keys (with its reward scaling and shaping, e.g. 0/1
    correctness onto -1/+1), the advantage estimator (GAE), and PPO's update schedule."""

    adv_estimator: PPOAdvEstimatorConfig = Field(default_factory=PPOAdvEstimatorConfig)
    ppo_epochs: Annotated[int, Field(ge=1), Wired(f"{_PPO}:update_policy_and_value")] = 1
    policy_training_start_step: Annotated[
        int, Field(ge=0), Wired(f"{_PPO}:update_policy_and_value")
    ] = 0

    @model_validator(mode="before")
    @classmethod
    def _no_async_training(cls, data: Any) -> Any:
        """``grpo.async_grpo`` copied under ``ppo:`` is refused by name, not as a stray key."""
        if isinstance(data, dict) and "async_grpo" in data:
            raise ValueError(
                "async_grpo: asynchronous training is GRPO's (NeMo RL's async_grpo_train); "
                "PPO's value model and GAE train on rollouts of the current weights, and "
                "NeMo RL's PPO has no asynchronous mode; remove the key"
            )
        return data


class PPOMasterConfig(RLMasterConfig):
    """The whole YAML of a PPO run: GRPO's sections plus the value model and its loss."""

    ppo: PPOConfig
    value: ValueConfig
    value_loss_fn: MseValueLossConfig = Field(default_factory=MseValueLossConfig)

    @property
    def algorithm(self) -> PPOConfig:
        return self.ppo
