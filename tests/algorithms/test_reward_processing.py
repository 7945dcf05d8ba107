"""Between scoring and advantages, in NeMo RL's order: reward scaling, DAPO's overlong
penalty, overlong filtering, and dynamic sampling's selection over refill rounds."""

import pytest
import torch

from nemo_rl_core.algorithms.grpo import (
    DynamicSamplingExhaustedError,
    GRPOConfig,
    process_rewards,
    select_prompt_groups,
)
from nemo_rl_core.algorithms.ppo import PPOConfig
from nemo_rl_core.algorithms.prompt_batches import prompts_per_batch
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class Config:
    """The one section these functions read (``config.algorithm``)."""

    def __init__(self, **grpo):
        keys = {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 9}
        self.algorithm = GRPOConfig(**{**keys, **grpo})


def rollouts(rewards, prompt_index, generated, truncated) -> BatchedDataDict:
    logs = [
        [
            {"role": "user", "token_ids": torch.ones(5, dtype=torch.long)},
            {"role": "assistant", "token_ids": torch.ones(n, dtype=torch.long)},
        ]
        for n in generated
    ]
    return BatchedDataDict(
        {
            "total_reward": torch.tensor(rewards, dtype=torch.float32),
            "prompt_index": torch.tensor(prompt_index),
            "message_log": logs,
            "truncated": torch.tensor(truncated),
            "loss_multiplier": torch.ones(len(rewards)),
        }
    )


def test_scaling_then_shaping_then_overlong_filtering():
    config = Config(
        reward_scaling={"enabled": True, "target_min": -1.0, "target_max": 1.0},
        reward_shaping={
            "enabled": True,
            "max_response_length": 10,
            "overlong_buffer_length": 4,
            "overlong_buffer_penalty": 0.5,
        },
        overlong_filtering=True,
    )
    batch = rollouts([1.0, 0.0, 1.0], [0, 0, 1], [4, 8, 12], [False, False, True])
    batch, metrics = process_rewards(batch, config)
    # scaled onto [-1, 1]: 1, -1, 1; penalty = min((6 - len) / 4, 0) * 0.5, no floor
    assert batch["unshaped_total_reward"].tolist() == [1.0, -1.0, 1.0]
    assert batch["total_reward"].tolist() == pytest.approx([1.0, -1.25, 0.25])
    assert batch["loss_multiplier"].tolist() == [1.0, 1.0, 0.0]  # the truncated one leaves the loss
    assert metrics["overlong_filtered_fraction"] == pytest.approx(1 / 3)
    # the stored total_reward's mean, beside the environments' mean_reward
    assert metrics["mean_total_reward"] == pytest.approx((1.0 - 1.25 + 0.25) / 3)


def test_nothing_changes_with_the_defaults():
    batch = rollouts([1.0, 0.0], [0, 0], [3, 40], [False, True])
    batch, metrics = process_rewards(batch, Config())
    assert batch["total_reward"].tolist() == [1.0, 0.0]
    assert batch["loss_multiplier"].tolist() == [1.0, 1.0]
    assert "unshaped_total_reward" not in batch and metrics == {}


def test_batch_multiplier_needs_dynamic_sampling():
    with pytest.raises(ValueError, match="batch_multiplier=2.0 needs use_dynamic_sampling"):
        Config(batch_multiplier=2.0)
    assert prompts_per_batch(Config(use_dynamic_sampling=True, batch_multiplier=1.5).algorithm) == 3


def test_selection_keeps_varied_groups_across_rounds_until_the_batch_is_full():
    config = Config(use_dynamic_sampling=True, use_leave_one_out_baseline=False)
    # round 0: prompt 0 varies, prompt 1 does not -> 2 of the 4 samples a step needs
    first = rollouts([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], [3] * 4, [False] * 4)
    kept, complete, metrics = select_prompt_groups(first, None, config, 0)
    assert not complete and kept["prompt_index"].tolist() == [0, 0]
    assert metrics["dynamic_sampling_num_gen_batches"] == 1
    # round 1: both prompts vary -> 2 + 4 kept, cut to 4
    second = rollouts([0.0, 1.0, 1.0, 0.0], [2, 2, 3, 3], [3] * 4, [False] * 4)
    kept, complete, metrics = select_prompt_groups(second, kept, config, 1)
    assert complete and kept["prompt_index"].tolist() == [0, 0, 2, 2]
    assert metrics["dynamic_sampling_num_discarded_valid_samples"] == 2


def test_selection_gives_up_after_the_allowed_batches():
    config = Config(use_dynamic_sampling=True, dynamic_sampling_max_gen_batches=2)
    flat = rollouts([0.0] * 4, [0, 0, 1, 1], [3] * 4, [False] * 4)
    select_prompt_groups(flat, None, config, 1)  # 2 batches processed: NeMo RL goes on
    with pytest.raises(DynamicSamplingExhaustedError, match="processed 3 generation batches"):
        select_prompt_groups(flat, None, config, 2)


def test_ppo_selection_uses_the_plain_group_std():
    """ppo: has no use_leave_one_out_baseline (its baseline is the value model)."""
    config = Config()
    config.algorithm = PPOConfig(
        num_prompts_per_step=2, num_generations_per_prompt=3, max_num_steps=9,
        use_dynamic_sampling=True,
    )  # fmt: skip
    batch = rollouts([1.0, 1.0, 0.0, 1.0, 1.0, 1.0], [0, 0, 0, 1, 1, 1], [3] * 6, [False] * 6)
    kept, complete, _ = select_prompt_groups(batch, None, config, 0)
    assert not complete and kept["prompt_index"].tolist() == [0, 0, 0]
