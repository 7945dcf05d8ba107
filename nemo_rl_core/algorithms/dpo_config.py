"""The config of a DPO run (NeMo RL's ``nemo_rl.algorithms.dpo.DPOConfig`` and its
``MasterConfig``) and what DPO and reward-model runs share, apart from the work of their
stages (:mod:`nemo_rl_core.algorithms.dpo`, which re-exports these names by NeMo RL's
path): the config check imports it without torch.
"""

from typing import Annotated, Any, ClassVar, Self

from pydantic import Field, model_validator

from nemo_rl_core.algorithms.config import DPOLossConfig
from nemo_rl_core.algorithms.schedule import validates
from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.config.checkpointing import CheckpointingConfig
from nemo_rl_core.config.cluster import ClusterConfig
from nemo_rl_core.config.logger import LoggerConfig
from nemo_rl_core.config.orchestration import OrchestrationConfig
from nemo_rl_core.data.config import PREFERENCE_PROCESSOR, PreferenceDataConfig
from nemo_rl_core.data.datasets.builder import SPLITS, DataSetup, processor_name
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.utils.key_support import Wired

_DPO = "nemo_rl_core.algorithms.dpo"
_SCHEDULE = "nemo_rl_core.algorithms.schedule"


class DPOConfig(DPOLossConfig):
    """``dpo:``: NeMo RL's keys and defaults (``examples/configs/dpo.yaml``); the loss keys
    are ``DPOLossConfig``'s."""

    max_num_epochs: Annotated[int, Field(ge=1), Wired(f"{_SCHEDULE}:planned_steps")] = 1
    max_num_steps: Annotated[int, Field(ge=1), Wired(f"{_SCHEDULE}:planned_steps")] = 150
    val_period: Annotated[int, Wired(f"{_SCHEDULE}:validation_due")] = 25  # <= 0: never
    val_batches: Annotated[int, Wired(f"{_DPO}:validation_batches")] = 8  # <= 0: all
    val_global_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_batches")] = 8
    val_micro_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_metrics")] = 1
    val_at_start: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = True
    val_at_end: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = False
    seed: Annotated[int, Wired(f"{_DPO}:make_dataloader")] = 42


class PreferenceMasterConfig(StrictConfig):
    """What the YAML of a DPO and of a reward-model run share: all but the algorithm's
    section (``SECTION``), checked for preference training (``SCALAR_HEAD``: the policy
    is a reward model)."""

    SECTION: ClassVar[str]
    SCALAR_HEAD: ClassVar[bool]

    policy: PolicyConfig
    data: PreferenceDataConfig
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)

    @model_validator(mode="after")
    def _pairs_stay_together(self) -> Self:
        check_preference_setup(self, self.SECTION, self.SCALAR_HEAD)
        return self


class DPOMasterConfig(PreferenceMasterConfig):
    """The whole YAML of a DPO run (NeMo RL's ``dpo.MasterConfig``)."""

    SECTION = "dpo"
    SCALAR_HEAD = False

    dpo: DPOConfig

    @property
    def algorithm(self) -> DPOConfig:
        return self.dpo


def check_preference_setup(config: Any, section: str, scalar_head: bool) -> None:
    """What DPO and reward-model training need of the data, the model and the batching:
    every dataset it reads is preference pairs (``preference_preprocessor``), held-out pairs
    (``data.validation`` or ``data.val_data_paths``) when validation is on, a language model
    (DPO) or a scalar head (``scalar_head``: reward model) and microbatches that keep a
    pair's two sequences together."""
    for split in SPLITS:
        for index, dataset in enumerate(config.data.datasets(split)):
            name = processor_name(dataset, data_setup(config))
            if name != PREFERENCE_PROCESSOR:
                raise ValueError(
                    f"data.{split}[{index}].processor: {section} trains on preference pairs "
                    f"({PREFERENCE_PROCESSOR}; datasets PreferenceDataset, "
                    f"BinaryPreferenceDataset, addition_preference), not on {name!r} rows"
                )
    if validates(config.algorithm) and not (config.data.validation or config.data.val_data_paths):
        raise ValueError(
            f"{section}.val_period / val_at_start / val_at_end validate, but there is no "
            "data.validation (nor data.val_data_paths): add held-out pairs, or turn "
            "validation off (val_period: 0, val_at_start: false)"
        )
    if config.policy.reward_model_cfg.enabled != scalar_head:
        trains = "a scalar-head reward model" if scalar_head else "a language model"
        raise ValueError(
            f"policy.reward_model_cfg.enabled={not scalar_head}: a {section} run trains {trains}"
        )
    for key in ("dynamic_batching", "sequence_packing"):
        if getattr(config.policy, key).enabled:
            raise ValueError(
                f"policy.{key}.enabled: {section} needs each pair's chosen and rejected "
                "sequences side by side in one microbatch, which reordering by length breaks"
            )


def data_setup(config: Any) -> DataSetup:
    """Datasets processed by ``preference_preprocessor``, capped at the policy's length."""
    return DataSetup(
        max_seq_length=config.policy.max_total_sequence_length,
        default_processor=PREFERENCE_PROCESSOR,
    )
