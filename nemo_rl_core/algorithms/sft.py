"""SFT (NeMo RL's ``nemo_rl.algorithms.sft``): the work of each stage (its config is
:mod:`~nemo_rl_core.algorithms.sft_config`'s, re-exported here by NeMo RL's names).

NeMo RL's ``sft_train`` loop takes a batch of conversations, masks every turn but the
assistant's, takes one optimizer step of ``NLLLossFn`` and validates every ``val_period``
steps (the loss on the held-out conversations, no generation). Here each of those is a
function a stage calls, so a stored batch can be trained on again bit for bit.
"""

from collections.abc import Iterator
from typing import Any

# NeMo RL names the config classes here; they live apart so that the config check loads
# no torch.
from nemo_rl_core.algorithms.sft_config import (  # noqa: F401
    SFTConfig,
    SFTMasterConfig,
    data_setup,
)
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import build_dataset
from nemo_rl_core.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    batched_message_log_to_flat_message,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.interfaces import PolicyInterface

MasterConfig = SFTMasterConfig  # NeMo RL's name for it in this module


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
