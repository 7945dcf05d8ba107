"""The config of a PPO run (NeMo RL's ``ppo:`` recipe): GRPO's sections plus the value
model, apart from the work of PPO's stages (:mod:`nemo_rl_core.algorithms.ppo`, which
re-exports these names): the config check imports it without torch.
"""

from typing import Annotated

from pydantic import Field

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


class PPOMasterConfig(RLMasterConfig):
    """The whole YAML of a PPO run: GRPO's sections plus the value model and its loss."""

    ppo: PPOConfig
    value: ValueConfig
    value_loss_fn: MseValueLossConfig = Field(default_factory=MseValueLossConfig)

    @property
    def algorithm(self) -> PPOConfig:
        return self.ppo
