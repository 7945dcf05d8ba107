"""SFT (NeMo RL's ``nemo_rl.algorithms.sft``): its config and the work of each stage.

NeMo RL's ``sft_train`` loop takes a batch of conversations, masks every turn but the
assistant's, takes one optimizer step of ``NLLLossFn`` and validates every ``val_period``
steps (the loss on the held-out conversations, no generation). Here each of those is a
function a stage calls, so a stored batch can be trained on again bit for bit.
"""

from collections.abc import Iterator
from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from nemo_rl_core.algorithms.grpo_config import validates
from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.config.checkpointing import CheckpointingConfig
from nemo_rl_core.config.cluster import ClusterConfig
from nemo_rl_core.config.logger import LoggerConfig
from nemo_rl_core.config.orchestration import OrchestrationConfig
from nemo_rl_core.data.config import SFT_PROCESSOR, SFTDataConfig
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import SPLITS, DataSetup, build_dataset, processor_name
from nemo_rl_core.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    batched_message_log_to_flat_message,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.utils.key_support import Wired

_SFT = "nemo_rl_core.algorithms.sft"
_GRPO = "nemo_rl_core.algorithms.grpo"


class SFTConfig(StrictConfig):
    """``sft:``: NeMo RL's keys and defaults (``examples/configs/sft.yaml``)."""

    max_num_epochs: Annotated[int, Field(ge=1), Wired(f"{_GRPO}:planned_steps")] = 1
    max_num_steps: Annotated[int, Field(ge=1), Wired(f"{_GRPO}:planned_steps")] = 60
    val_period: Annotated[int, Wired(f"{_GRPO}:validation_due")] = 10  # <= 0: never
    val_batches: Annotated[int, Wired(f"{_SFT}:validation_batches")] = 8  # <= 0: all
    val_global_batch_size: Annotated[int, Field(ge=1), Wired(f"{_SFT}:validation_batches")] = 32
    val_micro_batch_size: Annotated[int, Field(ge=1), Wired(f"{_SFT}:validation_loss")] = 1
    val_at_start: Annotated[bool, Wired(f"{_GRPO}:validation_due")] = True
    val_at_end: Annotated[bool, Wired(f"{_GRPO}:validation_due")] = False
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


def make_dataloader(config: SFTMasterConfig, tokenizer: Any) -> StatefulDataLoader:
    """One global batch (``policy.train_global_batch_size``) of conversations per step,
    shuffled from ``sft.seed``; the last partial batch of an epoch is dropped, as in NeMo RL."""
    return StatefulDataLoader(
        build_dataset(config.data, tokenizer, setup=data_setup(config)),
        batch_size=config.policy.train_global_batch_size,
        shuffle=config.data.shuffle,
        seed=config.sft.seed,
        drop_last=True,
    )


def conversations_to_train_data(
    batch: BatchedDataDict, tokenizer: Any, config: SFTMasterConfig
) -> BatchedDataDict:
    """What ``policy.train`` takes: the conversations right-padded into ``input_ids``, the
    assistant turns (only the final turn with ``only_unmask_final``) as ``token_mask`` and
    each sample's ``loss_multiplier`` (0 for a conversation cut to fit) as ``sample_mask``."""
    add_loss_mask_to_message_log(
        batch["message_log"],
        roles_to_train_on=["assistant"],
        only_unmask_final=config.sft.only_unmask_final,
    )
    flat, input_lengths = batched_message_log_to_flat_message(
        batch["message_log"],
        pad_value_dict={"token_ids": tokenizer.pad_token_id},
        make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
    )
    return BatchedDataDict(
        {
            "input_ids": flat["token_ids"],
            "input_lengths": input_lengths,
            "token_mask": flat["token_loss_mask"].float(),
            "sample_mask": batch["loss_multiplier"].float(),
        }
    )


def take_batch(
    dataloader: StatefulDataLoader, config: SFTMasterConfig, tokenizer: Any, state: dict
) -> tuple[BatchedDataDict, dict]:
    """The training data of the global batch after ``state``, and the state after it."""
    dataloader.load_state_dict(state)
    batch = dataloader.next_batch()
    return conversations_to_train_data(batch, tokenizer, config), dataloader.state_dict()


def validation_batches(config: SFTMasterConfig, tokenizer: Any) -> Iterator[BatchedDataDict]:
    """The held-out conversations in order, ``val_global_batch_size`` per batch, at most
    ``val_batches`` batches (all when <= 0), as training data."""
    dataset = build_dataset(config.data, tokenizer, split="validation", setup=data_setup(config))
    loader = StatefulDataLoader(
        dataset, batch_size=config.sft.val_global_batch_size, shuffle=False, drop_last=False
    )
    count = len(loader)
    if config.sft.val_batches > 0:
        count = min(count, config.sft.val_batches)
    for _ in range(count):
        yield conversations_to_train_data(loader.next_batch(), tokenizer, config)


def validation_loss(
    policy: PolicyInterface,
    batches: Iterator[BatchedDataDict],
    loss_fn: Any,
    config: SFTMasterConfig,
) -> dict[str, float]:
    """NeMo RL's ``val_loss``: the loss of each batch in eval mode (no update), weighted by
    its valid tokens (``sample_mask`` x ``token_mask``)."""
    total = tokens = 0.0
    policy.prepare_for_training()
    try:
        for batch in batches:
            results = policy.train(
                batch,
                loss_fn,
                eval_mode=True,
                gbs=batch.size,
                mbs=config.sft.val_micro_batch_size,
            )
            valid = float((batch["sample_mask"].unsqueeze(-1) * batch["token_mask"]).sum())
            total += float(results["loss"].sum()) * valid
            tokens += valid
    finally:
        policy.finish_training()
    if tokens == 0:
        raise ValueError(
            "validation has no token to score: the validation conversations are empty or "
            "all longer than policy.max_total_sequence_length"
        )
    return {"val_loss": total / tokens, "val_tokens": tokens}
