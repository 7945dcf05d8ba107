"""DPO (NeMo RL's ``nemo_rl.algorithms.dpo``): its config and the work of each stage.

NeMo RL's ``dpo_train`` takes a batch of preference pairs (chosen and rejected interleaved),
adds the reference policy's logprobs of every token, takes one optimizer step of
``DPOLossFn`` and validates every ``val_period`` steps (the loss, preference accuracy and
rewards on held-out pairs, no generation). Here each of those is a function a stage calls;
the reference logprobs are a stored stage, so a rerun of ``train`` reads the same tensors.
"""

from collections.abc import Iterator
from functools import partial
from typing import Annotated, Any, ClassVar, Self

import torch
from pydantic import Field, model_validator

from nemo_rl_core.algorithms.config import (
    PREFERENCE_VALIDATION_PREFIX,
    DPOLossConfig,
    StrictConfig,
)
from nemo_rl_core.algorithms.grpo_config import validates
from nemo_rl_core.data.config import PREFERENCE_PROCESSOR, DataConfig
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import SPLITS, DataSetup, build_dataset, processor_name
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.distributed.virtual_cluster import ClusterConfig
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.pipeline.orchestration import OrchestrationConfig
from nemo_rl_core.utils.checkpoint import CheckpointingConfig
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import Wired
from nemo_rl_core.utils.logger import LoggerConfig

_DPO = "nemo_rl_core.algorithms.dpo"
_GRPO = "nemo_rl_core.algorithms.grpo"
VALIDATION_METRICS = (
    "loss",
    "sft_loss",
    "preference_loss",
    "accuracy",
    "rewards_chosen_mean",
    "rewards_rejected_mean",
)


class DPOConfig(DPOLossConfig):
    """``dpo:``: NeMo RL's keys and defaults (``examples/configs/dpo.yaml``); the loss keys
    are ``DPOLossConfig``'s."""

    max_num_epochs: Annotated[int, Field(ge=1), Wired(f"{_GRPO}:planned_steps")] = 1
    max_num_steps: Annotated[int, Field(ge=1), Wired(f"{_GRPO}:planned_steps")] = 150
    val_period: Annotated[int, Wired(f"{_GRPO}:validation_due")] = 25  # <= 0: never
    val_batches: Annotated[int, Wired(f"{_DPO}:validation_batches")] = 8  # <= 0: all
    val_global_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_batches")] = 8
    val_micro_batch_size: Annotated[int, Field(ge=1), Wired(f"{_DPO}:validation_metrics")] = 1
    val_at_start: Annotated[bool, Wired(f"{_GRPO}:validation_due")] = True
    val_at_end: Annotated[bool, Wired(f"{_GRPO}:validation_due")] = False
    seed: Annotated[int, Wired(f"{_DPO}:make_dataloader")] = 42


class PreferenceMasterConfig(StrictConfig):
    """What the YAML of a DPO and of a reward-model run share: all but the algorithm's
    section (``SECTION``), checked for preference training (``SCALAR_HEAD``: the policy
    is a reward model)."""

    SECTION: ClassVar[str]
    SCALAR_HEAD: ClassVar[bool]

    policy: PolicyConfig
    data: DataConfig
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
    every dataset is preference pairs (``preference_preprocessor``), held-out pairs when
    validation is on, a language model (DPO) or a scalar head (``scalar_head``: reward
    model) and microbatches that keep a pair's two sequences together."""
    for split in SPLITS:
        for index, dataset in enumerate(config.data.datasets(split)):
            name = processor_name(dataset, data_setup(config))
            if name != PREFERENCE_PROCESSOR:
                raise ValueError(
                    f"data.{split}[{index}].processor: {section} trains on preference pairs "
                    f"({PREFERENCE_PROCESSOR}; datasets PreferenceDataset, "
                    f"BinaryPreferenceDataset, addition_preference), not on {name!r} rows"
                )
    if validates(config.algorithm) and not config.data.validation:
        raise ValueError(
            f"{section}.val_period / val_at_start / val_at_end validate, but there is no "
            "data.validation: add held-out pairs, or turn validation off (val_period: 0, "
            "val_at_start: false)"
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


def _pair_loader(
    config: Any, tokenizer: Any, split: str, batch_size: int, shuffle: bool, drop_last: bool
) -> StatefulDataLoader:
    from nemo_rl_core.data.datasets.processed_dataset import preference_collate_fn

    return StatefulDataLoader(
        build_dataset(config.data, tokenizer, split=split, setup=data_setup(config)),
        batch_size=batch_size,
        shuffle=shuffle,
        seed=config.algorithm.seed,
        drop_last=drop_last,
        collate_fn=partial(
            preference_collate_fn,
            tokenizer=tokenizer,
            make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
        ),
    )


def make_dataloader(config: Any, tokenizer: Any) -> StatefulDataLoader:
    """``policy.train_global_batch_size`` pairs per step (twice as many sequences),
    shuffled from the algorithm's ``seed``; the last partial batch of an epoch is dropped."""
    return _pair_loader(
        config,
        tokenizer,
        "train",
        config.policy.train_global_batch_size,
        shuffle=config.data.shuffle,
        drop_last=True,
    )


def take_batch(dataloader: StatefulDataLoader, state: dict) -> tuple[BatchedDataDict, dict]:
    """The training data of the global batch after ``state``, and the state after it."""
    dataloader.load_state_dict(state)
    batch = dataloader.next_batch()
    return batch, dataloader.state_dict()


def validation_batches(config: Any, tokenizer: Any) -> Iterator[BatchedDataDict]:
    """The held-out pairs in order, ``val_global_batch_size`` pairs per batch, at most
    ``val_batches`` batches (all when <= 0)."""
    loader = _pair_loader(
        config,
        tokenizer,
        "validation",
        config.algorithm.val_global_batch_size,
        shuffle=False,
        drop_last=False,
    )
    count = len(loader)
    if config.algorithm.val_batches > 0:
        count = min(count, config.algorithm.val_batches)
    for _ in range(count):
        yield loader.next_batch()


class NothingToTrainError(ConfigError):
    """A step's batch holds no pair to train on: every pair is longer than the policy takes."""


def require_pairs_to_train(batch: BatchedDataDict, config: Any, step: int) -> None:
    """Refuse a step whose every pair was too long to train on (their ``sample_mask`` is 0,
    as NeMo RL ignores them): it would change no weight, and a run of such steps would end
    green with an untrained model (a reward model's head all zeros)."""
    if float(batch["sample_mask"].sum()) > 0:
        return
    limit = config.policy.max_total_sequence_length
    raise NothingToTrainError(
        f"step {step}: none of the {batch.size // 2} pairs of the batch fits "
        f"policy.max_total_sequence_length={limit} (a pair longer than that is ignored, as "
        "NeMo RL ignores it), so the step would train nothing; raise "
        "policy.max_total_sequence_length or shorten the pairs"
    )


def with_reference_logprobs(
    policy: PolicyInterface, batch: BatchedDataDict, micro_batch_size: int
) -> BatchedDataDict:
    """``batch`` with ``reference_policy_logprobs``: position t holds the reference policy's
    log-prob of token t+1 (NeMo RL rolls them left by one), as ``DPOLossFn`` reads them."""
    logprobs = policy.get_reference_policy_logprobs(batch, micro_batch_size=micro_batch_size)
    return BatchedDataDict(
        {
            **batch,
            "reference_policy_logprobs": torch.roll(logprobs["reference_logprobs"], -1, dims=-1),
        }
    )


def validation_metrics(
    policy: PolicyInterface,
    batches: Iterator[BatchedDataDict],
    loss_fn: Any,
    config: Any,
    names: tuple[str, ...] = VALIDATION_METRICS,
    with_reference: bool = True,
) -> dict[str, float]:
    """NeMo RL's DPO (and reward-model) validation: each batch's loss metrics ``names`` in
    eval mode (no update; DPO's with the reference logprobs it needs), the batches
    weighted by their valid pairs, as ``validation-default_<metric>``."""
    from nemo_rl_core.algorithms.grpo import merge_step_metrics

    mbs = 2 * config.algorithm.val_micro_batch_size
    weighted = dict.fromkeys(names, 0.0)
    pairs = 0.0
    policy.prepare_for_training()
    try:
        for batch in batches:
            if with_reference:
                batch = with_reference_logprobs(policy, batch, mbs)
            results = policy.train(batch, loss_fn, eval_mode=True, gbs=batch.size, mbs=mbs)
            merged = merge_step_metrics(results)
            for name in names:
                weighted[name] += merged[name] * merged["num_valid_samples"]
            pairs += merged["num_valid_samples"]
    finally:
        policy.finish_training()
    if pairs == 0:
        raise ValueError(
            "validation has no pair to score: the validation pairs are empty or all longer "
            f"than policy.max_total_sequence_length={config.policy.max_total_sequence_length}"
        )
    metrics = {f"{PREFERENCE_VALIDATION_PREFIX}{name}": weighted[name] / pairs for name in weighted}
    return metrics | {f"{PREFERENCE_VALIDATION_PREFIX}num_valid_samples": pairs}
