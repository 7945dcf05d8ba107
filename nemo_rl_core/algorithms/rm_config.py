"""The config of a reward-model run (NeMo RL's ``nemo_rl.algorithms.rm.RMConfig`` and its
``MasterConfig``), apart from its validation (:mod:`nemo_rl_core.algorithms.rm`, which
re-exports these names by NeMo RL's path): the config check imports it without torch.
"""

from typing import Annotated, Self

from pydantic import Field, model_validator

from nemo_rl_core.algorithms.dpo_config import PreferenceMasterConfig
from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.utils.key_support import Wired

_DPO = "nemo_rl_core.algorithms.dpo"
_SCHEDULE = "nemo_rl_core.algorithms.schedule"


class RMConfig(StrictConfig):
    """``rm:``: NeMo RL's keys and defaults (``examples/configs/rm.yaml``)."""

    max_num_epochs: Annotated[int, Field(ge=1), Wired(f"{_SCHEDULE}:planned_steps")] = 1
    # -1: no step limit (max_num_epochs decides)
    max_num_steps: Annotated[int, Field(ge=-1), Wired(f"{_SCHEDULE}:planned_steps")] = -1
    val_period: Annotated[int, Wired(f"{_SCHEDULE}:validation_due")] = 16  # <= 0: never
    val_batches: Annotated[int, Wired(f"{_DPO}:validation_batches")] = -1  # <= 0: all
    val_global_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_batches")] = 32
    val_micro_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_metrics")] = 1
    val_at_start: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = False
    val_at_end: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = False
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
