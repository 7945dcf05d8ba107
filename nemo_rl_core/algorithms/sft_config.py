"""The config of an SFT run (NeMo RL's ``nemo_rl.algorithms.sft.SFTConfig`` and its
``MasterConfig``), apart from the work of its stages (:mod:`nemo_rl_core.algorithms.sft`,
which re-exports these names by NeMo RL's path): the config check imports it without torch.
"""

from typing import Annotated, Self

from pydantic import Field, model_validator

from nemo_rl_core.algorithms.schedule import validates
from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.config.checkpointing import CheckpointingConfig
from nemo_rl_core.config.cluster import ClusterConfig
from nemo_rl_core.config.logger import LoggerConfig
from nemo_rl_core.config.orchestration import OrchestrationConfig
from nemo_rl_core.data.config import SFT_PROCESSOR, SFTDataConfig
from nemo_rl_core.data.datasets.builder import SPLITS, DataSetup, processor_name
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.utils.key_support import Wired

_SFT = "nemo_rl_core.algorithms.sft"
_SCHEDULE = "nemo_rl_core.algorithms.schedule"


class SFTConfig(StrictConfig):
    """``sft:``: NeMo RL's keys and defaults (``examples/configs/sft.yaml``)."""

    max_num_epochs: Annotated[int, Field(ge=1), Wired(f"{_SCHEDULE}:planned_steps")] = 1
    max_num_steps: Annotated[int, Field(ge=1), Wired(f"{_SCHEDULE}:planned_steps")] = 60
    val_period: Annotated[int, Wired(f"{_SCHEDULE}:validation_due")] = 10  # <= 0: never
    val_batches: Annotated[int, Wired(f"{_SFT}:validation_batches")] = 8  # <= 0: all
    val_global_batch_size: Annotated[int, Field(ge=1), Wired(f"{_SFT}:validation_batches")] = 32
    val_micro_batch_size: Annotated[int, Field(ge=1), Wired(f"{_SFT}:validation_loss")] = 1
    val_at_start: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = True
    val_at_end: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = False
    seed: Annotated[int, Wired(f"{_SFT}:make_dataloader")] = 42
    only_unmask_final: Annotated[bool, Wired(f"{_SFT}:conversations_to_train_data")] = False


class SFTMasterConfig(StrictConfig):
    """The whole YAML of an SFT run (NeMo RL's ``sft.MasterConfig``)."""

    sft: SFTConfig
    policy: PolicyConfig
    data: SFTDataConfig
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)

    @property
    def algorithm(self) -> SFTConfig:
        return self.sft

    @model_validator(mode="after")
    def _datasets_are_conversations(self) -> Self:
        """Every dataset is processed by ``sft_processor``; validation needs held-out data."""
        for split in SPLITS:
            for index, dataset in enumerate(self.data.datasets(split)):
                name = processor_name(dataset, data_setup(self))
                if name != SFT_PROCESSOR:
                    raise ValueError(
                        f"data.{split}[{index}].processor: SFT trains on conversations "
                        f"({SFT_PROCESSOR}), not on {name!r} prompts"
                    )
        if validates(self.sft) and not (self.data.validation or self.data.split_from_train):
            raise ValueError(
                "sft.val_period / val_at_start / val_at_end validate, but there is no "
                "validation data: set data.validation (or split_validation_size), or turn "
                "validation off (val_period: 0, val_at_start: false)"
            )
        return self


def data_setup(config: SFTMasterConfig) -> DataSetup:
    """Datasets processed by ``sft_processor`` (with ``data.add_bos``, ``add_eos`` and
    ``add_generation_prompt``), capped at the policy's sequence length."""
    return DataSetup(
        max_seq_length=config.policy.max_total_sequence_length,
        default_processor=SFT_PROCESSOR,
        sft_options={
            "add_bos": config.data.add_bos,
            "add_eos": config.data.add_eos,
            "add_generation_prompt": config.data.add_generation_prompt,
        },
    )
