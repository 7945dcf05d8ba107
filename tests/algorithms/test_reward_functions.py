"""DAPO's overlong penalty, the stop-properly penalty and reward scaling, on hand numbers."""

import pytest
import torch

from nemo_rl_core.algorithms.grpo import GRPOConfig
from nemo_rl_core.algorithms.reward_functions import (
    RewardScalingConfig,
    RewardShapingConfig,
    RewardShapingError,
    apply_reward_shaping,
    scale_rewards,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

DAPO = {
    "enabled": True,
    "max_response_length": 10,
    "overlong_buffer_length": 4,
    "overlong_buffer_penalty": 0.5,
}


def batch_of(rewards, *turn_lengths, truncated=None):
    """One conversation per reward: a 3-token prompt, then turns of the given lengths
    (assistant, then alternating environment/assistant)."""
    logs = []
    for lengths in turn_lengths:
        log = [{"role": "user", "token_ids": torch.ones(3, dtype=torch.long)}]
        for i, n in enumerate(lengths):
            role = "assistant" if i % 2 == 0 else "environment"
            log.append({"role": role, "token_ids": torch.ones(n, dtype=torch.long)})
        logs.append(log)
    data = {"total_reward": torch.tensor(rewards), "message_log": logs}
    if truncated is not None:
        data["truncated"] = torch.tensor(truncated)
    return BatchedDataDict(data)


def test_overlong_penalty_grows_past_the_limit_without_a_floor():
    # no penalty up to 10 - 4 = 6 tokens; then -(n - 6) / 4 * 0.5: -0.5 at 10, -1.0 at 14
    batch = batch_of([1.0] * 5, [5], [6], [8], [10], [14])
    shaped = apply_reward_shaping(batch, RewardShapingConfig(**DAPO))
    assert shaped is batch
    assert batch["total_reward"].tolist() == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.0])
    assert batch["unshaped_total_reward"].tolist() == [1.0] * 5
    batch["total_reward"][0] = 7.0  # the kept rewards are a copy, not a view
    assert batch["unshaped_total_reward"][0] == 1.0


def test_response_length_is_the_first_assistant_turn():
    """As in NeMo RL: later assistant turns of a multi-turn episode are not counted."""
    batch = batch_of([0.0], [8, 2, 9])
    apply_reward_shaping(batch, DAPO)  # a plain dict, as NeMo RL passes its config
    assert batch["total_reward"].tolist() == pytest.approx([-0.25])
    given = batch_of([0.0], [8])
    given["response_token_lengths"] = torch.tensor([10])  # preferred when present
    assert apply_reward_shaping(given, DAPO)["total_reward"].tolist() == pytest.approx([-0.5])


def test_disabled_shaping_leaves_the_batch_alone():
    batch = batch_of([1.0, 0.0], [50], [50])
    apply_reward_shaping(batch, {**DAPO, "enabled": False})
    assert batch["total_reward"].tolist() == [1.0, 0.0]
    assert "unshaped_total_reward" not in batch


def test_stop_properly_penalty_scales_truncated_rewards():
    batch = batch_of([1.0, 0.8, 0.6], [4], [50], [4], truncated=[False, True, True])
    cfg = RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.25)
    apply_reward_shaping(batch, cfg)
    assert batch["total_reward"].tolist() == pytest.approx([1.0, 0.2, 0.15])
    assert batch["unshaped_total_reward"].tolist() == pytest.approx([1.0, 0.8, 0.6])
    with pytest.warns(UserWarning, match="max_response_length.*are ignored"):
        apply_reward_shaping(batch_of([1.0], [4], truncated=[True]), {**cfg.model_dump(), **DAPO})


def test_bad_config_and_batch_are_named():
    cfg = RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.5)
    with pytest.raises(RewardShapingError, match="truncated field not found"):
        apply_reward_shaping(batch_of([1.0], [4]), cfg)
    cfg["stop_properly_penalty_coef"] = 1.5  # NeMo RL's way of changing a key
    with pytest.raises(AssertionError, match=r"must be in \[0, 1\], got 1.5"):
        apply_reward_shaping(batch_of([1.0], [4], truncated=[True]), cfg)
    partial = RewardShapingConfig(enabled=True, max_response_length=10)
    with pytest.raises(ValueError, match="overlong_buffer_length, overlong_buffer_penalty unset"):
        apply_reward_shaping(batch_of([1.0], [4]), partial)
    with pytest.raises(ValueError, match="overlong_buffer_length must be >= 1, got 0"):
        GRPOConfig(**_grpo(reward_shaping={**DAPO, "overlong_buffer_length": 0}))
    no_answer = batch_of([1.0], [])
    with pytest.raises(AssertionError, match="Assistant response not found .*sample 0"):
        apply_reward_shaping(no_answer, DAPO)
    mismatched = batch_of([1.0, 0.0], [4])
    with pytest.raises(ValueError, match="1 responses, 2 rewards"):
        apply_reward_shaping(mismatched, DAPO)
    with pytest.raises(KeyError, match="no key 'overlong_buffer'"):
        cfg["overlong_buffer"] = 3


def _grpo(**keys):
    return {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 1} | keys


def test_a_run_config_that_shaping_would_refuse_is_refused_up_front():
    with pytest.raises(
        ValueError,
        match=r"reward_shaping\n.* overlong_buffer_penalty, max_response_length unset: only DAPO",
    ):
        GRPOConfig(**_grpo(reward_shaping={"enabled": True, "overlong_buffer_length": 4}))
    with pytest.raises(
        ValueError, match=r"stop_properly_penalty_coef must be in \[0, 1\], got -0.1"
    ):
        GRPOConfig(**_grpo(reward_shaping={"enabled": True, "stop_properly_penalty_coef": -0.1}))
    # disabled: NeMo RL's YAML keeps the DAPO keys filled in and shaping off
    assert not GRPOConfig(**_grpo(reward_shaping={**DAPO, "enabled": False})).reward_shaping.enabled


def test_scaling_clamps_then_maps_onto_the_target_range():
    batch = BatchedDataDict({"total_reward": torch.tensor([-2.0, -1.0, 0.0, 0.5, 3.0])})
    cfg = RewardScalingConfig(
        enabled=True, source_min=-1.0, source_max=1.0, target_min=0.0, target_max=10.0
    )
    assert scale_rewards(batch, cfg) is batch
    assert batch["total_reward"].tolist() == pytest.approx([0.0, 0.0, 5.0, 7.5, 10.0])
    scale_rewards(batch, {"enabled": False})
    assert batch["total_reward"].tolist() == pytest.approx([0.0, 0.0, 5.0, 7.5, 10.0])
    with pytest.raises(ValueError, match="source_max"):
        RewardScalingConfig(enabled=True, source_min=1.0, source_max=1.0)
    # a disabled section is not read (NeMo RL), so its range is not refused either
    assert not RewardScalingConfig(source_min=1.0, source_max=1.0).enabled


def test_scaling_maps_each_reward_component_too():
    """A multi-reward environment's components (GDPO's reward1, reward2) are scaled as the
    total is, as NeMo RL does; other keys are left alone."""
    batch = BatchedDataDict(
        {
            "total_reward": torch.tensor([0.0, 2.0]),
            "reward1": torch.tensor([0.0, 1.0]),
            "reward2": torch.tensor([-5.0, 1.0]),
            "reward_scale": torch.tensor([7.0, 7.0]),
        }
    )
    cfg = RewardScalingConfig(
        enabled=True, source_min=0.0, source_max=2.0, target_min=-1.0, target_max=1.0
    )
    scale_rewards(batch, cfg)
    assert batch["total_reward"].tolist() == pytest.approx([-1.0, 1.0])
    assert batch["reward1"].tolist() == pytest.approx([-1.0, 0.0])
    assert batch["reward2"].tolist() == pytest.approx([-1.0, 0.0])
    assert batch["reward_scale"].tolist() == [7.0, 7.0]
