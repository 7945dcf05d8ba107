"""The value model's config section: the policy's training keys, nothing generation-related.

A PPO critic is trained like the policy (same optimizer, scheduler, batching and
precision keys), so a ``value:`` section reads like a ``policy:`` one.
"""

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from nemo_rl_core.models.policy.config import StrictModel, TrainedModelConfig
from nemo_rl_core.utils.key_support import Only


class ValueHeadConfig(StrictModel):
    """``value.reward_model_cfg``: NeMo RL builds its critic as a regression reward model
    and requires exactly these values; so does the value model here (a scalar head)."""

    enabled: Annotated[
        bool, Only(True, reason="the value model is a scalar regression head on the backbone")
    ] = True
    reward_model_type: Annotated[
        Literal["regression", "bradley_terry"],
        Only("regression", reason="a critic predicts returns: a regression head"),
    ] = "regression"


class ValueConfig(TrainedModelConfig):
    """``value:``: ``model_name`` is the policy's model (or checkpoint) to start the backbone
    from, or a separate model directory; a saved value checkpoint restores its head too."""

    reward_model_cfg: ValueHeadConfig = Field(default_factory=ValueHeadConfig)

    @model_validator(mode="after")
    def _no_lora(self) -> Self:
        lora = self.dtensor_cfg.lora_cfg
        if lora is not None and lora.enabled:
            raise ValueError(
                "dtensor_cfg.lora_cfg.enabled: LoRA is built for the policy, not the value "
                "model (its scalar head trains with the whole backbone)"
            )
        return self
