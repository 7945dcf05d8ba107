"""DPO (NeMo RL's ``nemo_rl.algorithms.dpo``): the work of each stage (its config is
:mod:`~nemo_rl_core.algorithms.dpo_config`'s, re-exported here by NeMo RL's names).

NeMo RL's ``dpo_train`` takes a batch of preference pairs (chosen and rejected interleaved),
adds the reference policy's logprobs of every token, takes one optimizer step of
``DPOLossFn`` and validates every ``val_period`` steps (the loss, preference accuracy and
rewards on held-out pairs, no generation). Here each of those is a function a stage calls;
the reference logprobs are a stored stage, so a rerun of ``train`` reads the same tensors.
"""

from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import torch

from nemo_rl_core.algorithms.config import preference_validation_prefix

# NeMo RL names the config classes here; they live apart so that the config check loads
# no torch.
from nemo_rl_core.algorithms.dpo_config import (  # noqa: F401
    DPOConfig,
    DPOMasterConfig,
    data_setup,
)
from nemo_rl_core.data.config import DataConfig
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import build_dataset
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.utils.config import ConfigError

MasterConfig = DPOMasterConfig  # NeMo RL's name for it in this module

VALIDATION_METRICS = (
    "loss",
    "sft_loss",
    "preference_loss",
    "accuracy",
    "rewards_chosen_mean",
    "rewards_rejected_mean",
)


def _pair_loader(
    config: Any,
    data: DataConfig,
    tokenizer: Any,
    split: str,
    batch_size: int,
    shuffle: bool,
    drop_last: bool,
) -> StatefulDataLoader:
    from nemo_rl_core.data.datasets.processed_dataset import preference_collate_fn

    return StatefulDataLoader(
        build_dataset(data, tokenizer, split=split, setup=data_setup(config)),
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
        config.data,
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


def validation_batches(config: Any, tokenizer: Any) -> dict[str, Iterator[BatchedDataDict]]:
    """Each validation set's held-out pairs by its name (``data.val_data_paths``'s, else
    "default": ``data.validation``), in order, ``val_global_batch_size`` pairs per batch,
    at most ``val_batches`` batches of each set (all when <= 0), as NeMo RL's."""
    return {
        name: _held_out_batches(config, data, tokenizer)
        for name, data in config.data.validation_sets().items()
    }


def _held_out_batches(config: Any, data: DataConfig, tokenizer: Any) -> Iterator[BatchedDataDict]:
    loader = _pair_loader(
        config,
        data,
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
    sets: Mapping[str, Iterator[BatchedDataDict]],
    loss_fn: Any,
    config: Any,
    names: tuple[str, ...] = VALIDATION_METRICS,
    with_reference: bool = True,
) -> dict[str, float]:
    """NeMo RL's DPO (and reward-model) validation of each named set of batches (``sets``,
    :func:`validation_batches`): each batch's loss metrics ``names`` in eval mode (no
    update; DPO's with the reference logprobs it needs), the batches weighted by their valid
    pairs, as ``validation-<set>_<metric>``."""
    mbs = 2 * config.algorithm.val_micro_batch_size
    metrics: dict[str, float] = {}
    policy.prepare_for_training()
    try:
        for set_name, batches in sets.items():
            scored = _set_metrics(policy, batches, loss_fn, mbs, names, with_reference)
            if scored is None:
                raise ValueError(
                    f"validation set {set_name!r} has no pair to score: its pairs are empty or "
                    "all longer than policy.max_total_sequence_length="
                    f"{config.policy.max_total_sequence_length}"
                )
            prefix = preference_validation_prefix(set_name)
            metrics |= {f"{prefix}{name}": value for name, value in scored.items()}
    finally:
        policy.finish_training()
    return metrics


def _set_metrics(
    policy: PolicyInterface,
    batches: Iterator[BatchedDataDict],
    loss_fn: Any,
    mbs: int,
    names: tuple[str, ...],
    with_reference: bool,
) -> dict[str, float] | None:
    """One set's metrics ``names`` weighted by valid pairs, and ``num_valid_samples``;
    None when no pair was scored."""
    from nemo_rl_core.algorithms.training import merge_step_metrics

    weighted = dict.fromkeys(names, 0.0)
    pairs = 0.0
    for batch in batches:
        if with_reference:
            batch = with_reference_logprobs(policy, batch, mbs)
        results = policy.train(batch, loss_fn, eval_mode=True, gbs=batch.size, mbs=mbs)
        merged = merge_step_metrics(results)
        for name in names:
            weighted[name] += merged[name] * merged["num_valid_samples"]
        pairs += merged["num_valid_samples"]
    if pairs == 0:
        return None
    return {name: total / pairs for name, total in weighted.items()} | {"num_valid_samples": pairs}
