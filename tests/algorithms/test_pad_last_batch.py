"""NeMo RL's ``maybe_pad_last_batch``: a last batch grows to whole microbatches on every
data-parallel rank, and the samples it adds count nowhere."""

import pytest
import torch

from nemo_rl_core.algorithms.utils import calculate_global_valid_counts, maybe_pad_last_batch
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def batch_of(size: int) -> BatchedDataDict:
    return BatchedDataDict(
        {
            "input_ids": torch.arange(size * 4).reshape(size, 4),
            "input_lengths": torch.full((size,), 4),
            "token_mask": torch.ones(size, 4),
            "sample_mask": torch.ones(size),
            "message_log": [[{"role": "user", "content": f"q{i}"}] for i in range(size)],
        }
    )


def test_every_field_grows_by_copies_of_the_last_sample_that_count_nowhere() -> None:
    batch = batch_of(5)
    counts = calculate_global_valid_counts(batch)
    padded = maybe_pad_last_batch(batch, dp_size=3, mbs=2)
    assert padded is batch and padded.size == 6
    assert torch.equal(padded["input_ids"][5], padded["input_ids"][4])
    assert padded["message_log"][5] == padded["message_log"][4]
    assert padded["message_log"][5] is not padded["message_log"][4]
    assert padded["sample_mask"].tolist() == [1, 1, 1, 1, 1, 0]
    assert calculate_global_valid_counts(padded) == counts  # the loss normaliser is unchanged
    shards = padded.shard_by_batch_size(3, batch_size=6)  # one global batch of 6
    assert [shard.size for shard in shards] == [2, 2, 2]


def test_a_whole_batch_is_left_alone_and_bad_sizes_are_refused() -> None:
    batch = batch_of(8)
    assert maybe_pad_last_batch(batch, dp_size=2, mbs=2).size == 8
    assert "token_mask" not in maybe_pad_last_batch(
        BatchedDataDict({"input_ids": torch.ones(3, 2), "sample_mask": torch.ones(3)}), 2, 1
    )
    with pytest.raises(ValueError, match="dp_size=0"):
        maybe_pad_last_batch(batch, dp_size=0, mbs=2)
