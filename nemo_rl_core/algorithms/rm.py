"""Reward-model training (NeMo RL's ``nemo_rl.algorithms.rm``): its config and validation.

NeMo RL's ``rm_train`` trains a scalar-head model (``policy.reward_model_cfg``) with the
Bradley-Terry loss (``PreferenceLossFn``) on preference pairs: the chosen response should
score above the rejected one. The data, the batches and the validation are DPO's
(:mod:`nemo_rl_core.algorithms.dpo`) without the reference policy; the committed
checkpoint is an HF folder that ``AutoModelForSequenceClassification`` loads, which
GRPO's ``reward_model`` environment can score with.
"""

from collections.abc import Iterator
from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from nemo_rl_core.algorithms.dpo import PreferenceMasterConfig, validation_metrics
from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.utils.key_support import Wired

_DPO = "nemo_rl_core.algorithms.dpo"
_GRPO = "nemo_rl_core.algorithms.grpo"
# PreferenceLossFn's metrics NeMo RL's rm validation reports
VALIDATION_METRICS = ("loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean")


class RMConfig(StrictConfig):
    """``rm:``: NeMo RL's keys and defaults (``examples/configs/rm.yaml``)."""

    max_num_epochs: Annotated[int, Field(ge=1), Wired(f"{_GRPO}:planned_steps")] = 1
    # -1: no step limit (max_num_epochs decides)
    max_num_steps: Annotated[int, Field(ge=-1), Wired(f"{_GRPO}:planned_steps")] = -1
    val_period: Annotated[int, Wired(f"{_GRPO}:validation_due")] = 16  # <= 0: never
    val_batches: Annotated[int, Wired(f"{_DPO}:validation_batches")] = -1  # <= 0: all
    val_global_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_batches")] = 32
    val_micro_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_metrics")] = 1
    val_at_start: Annotated[bool, Wired(f"{_GRPO}:validation_due")] = False
    val_at_end: Annotated[bool, Wired(f"{_GRPO}:validation_due")] = False
    seed: Annotated[int, Wired(f"{_DPO}:make_dataloader")] = 42

    @model_validator(mode="after")
    def _some_steps(self) -> Self:
        if self.max_num_steps == 0:
            raise ValueError("max_num_steps: 0 trains nothing; -1 trains max_num_epochs epochs")
        return self


class RMMasterConfig(PreferenceMasterConfig):
    """The whole YAML of a reward-model run (NeMo RL's ``rm.MasterConfig``)."""

    SECTION = "rm"
    SCALAR_HEAD = True

    rm: RMConfig

    @property
    def algorithm(self) -> RMConfig:
        return self.rm


def reward_validation(
    policy: PolicyInterface, batches: Iterator[BatchedDataDict], loss_fn: Any, config: Any
) -> dict[str, float]:
    """Bradley-Terry loss, accuracy and mean rewards on the held-out pairs (no reference)."""
    return validation_metrics(
        policy, batches, loss_fn, config, names=VALIDATION_METRICS, with_reference=False
    )
