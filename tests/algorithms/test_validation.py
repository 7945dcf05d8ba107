"""Validation: NeMo RL's schedule (val_at_start, val_period, val_at_end against the run's
final step) and the metrics of a validation table, against hand-computed values."""

import pytest
import torch

from nemo_rl_core.algorithms.grpo_config import RolloutLoopConfig
from nemo_rl_core.algorithms.schedule import planned_steps, validation_due
from nemo_rl_core.algorithms.validation import validation_metrics
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def loop(**keys) -> RolloutLoopConfig:
    return RolloutLoopConfig(num_prompts_per_step=2, max_num_steps=10, **keys)


def due_steps(config: RolloutLoopConfig, final: int) -> list[int]:
    return [step for step in range(final + 1) if validation_due(config, step, final)]


def test_schedule_matches_nemo_rl():
    assert due_steps(loop(val_period=3), 10) == [3, 6, 9]
    assert due_steps(loop(val_period=3, val_at_start=True), 10) == [0, 3, 6, 9]
    assert due_steps(loop(val_period=3, val_at_end=True), 10) == [3, 6, 9, 10]
    assert due_steps(loop(val_at_end=True), 10) == [10]
    assert due_steps(loop(), 10) == []


def test_val_at_end_follows_the_epoch_limit():
    config = loop(val_at_end=True, max_num_epochs=2)
    final = planned_steps(config, batches_per_epoch=3)
    assert final == 6
    assert due_steps(config, final) == [6]


def test_fewer_samples_than_one_batch_is_refused():
    with pytest.raises(ValueError, match="no whole validation batch"):
        loop(max_val_samples=4, val_batch_size=8)


def _log(tokens: int) -> list[dict]:
    return [
        {"role": "user", "token_ids": torch.ones(3, dtype=torch.long)},
        {"role": "assistant", "token_ids": torch.ones(tokens, dtype=torch.long)},
    ]


def test_metrics_of_a_table():
    # 2 prompts x 3 sampled responses, then one greedy response per prompt
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    table = BatchedDataDict(
        {
            "total_reward": torch.tensor(rewards),
            "prompt_index": torch.tensor([0, 0, 0, 1, 1, 1, 0, 1]),
            "greedy": torch.tensor([False] * 6 + [True] * 2),
            "message_log": [_log(n) for n in (2, 4, 6, 8, 10, 12, 1, 1)],
        }
    )
    metrics = validation_metrics(table, k=3)
    assert metrics["accuracy"] == pytest.approx(1 / 6)
    assert metrics["pass@3"] == 0.5  # prompt 0 solved once, prompt 1 never
    assert metrics["greedy_accuracy"] == 1.0
    assert metrics["avg_length"] == pytest.approx(7.0)
    assert metrics["num_prompts"] == 2
