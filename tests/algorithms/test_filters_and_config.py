"""Filters, metric aggregation and the YAML-facing configs."""

import math
from pathlib import Path

import pytest
import torch
import yaml

from nemo_rl_core.algorithms.config import ClippedPGLossConfig, PPOAdvEstimatorConfig
from nemo_rl_core.algorithms.filters import (
    accumulate_dynamic_sampling_batch,
    apply_overlong_filtering,
    dynamic_sampling_filter,
)
from nemo_rl_core.algorithms.grpo import GRPOConfig, load_master_config
from nemo_rl_core.algorithms.loss import (
    ClippedPGLossFn,
    MetricNormalizer,
    aggregate_microbatch_metrics,
)
from nemo_rl_core.algorithms.utils import calculate_baseline_and_std_per_prompt
from nemo_rl_core.config.base import validate_section
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

TINY_GRPO = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_math_tiny.yaml"

NEMO_RL_GRPO_YAML = """
grpo:
  num_prompts_per_step: 32
  num_generations_per_prompt: 16
  max_num_steps: 100
  normalize_rewards: true
  use_leave_one_out_baseline: true
  overlong_filtering: false
  use_dynamic_sampling: false
  dynamic_sampling_max_gen_batches: 10
  batch_multiplier: 1
  reward_shaping:
    enabled: false
    overlong_buffer_length: 128
    overlong_buffer_penalty: 1
    max_response_length: 512
  reward_scaling:
    enabled: false
    source_min: 0.0
    source_max: 1.0
    target_min: 0.0
    target_max: 1.0
loss_fn:
  reference_policy_kl_penalty: 0.01
  reference_policy_kl_type: "k3"
  kl_input_clamp_value: 20.0
  kl_output_clamp_value: 10.0
  ratio_clip_min: 0.2
  ratio_clip_max: 0.2
  ratio_clip_c: null
  use_on_policy_kl_approximation: false
  truncated_importance_sampling_ratio: null
  use_importance_sampling_correction: false
  token_level_loss: true
  force_on_policy_ratio: false
"""


def test_dynamic_sampling_keeps_groups_with_reward_variance():
    prompts = torch.tensor([0, 0, 0, 1, 1, 1])
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    _, std = calculate_baseline_and_std_per_prompt(prompts, rewards, torch.ones(6), False)
    batch = BatchedDataDict(rewards=rewards, idx=list(range(6)))
    kept, metrics = dynamic_sampling_filter(batch, std)
    assert kept["idx"] == [3, 4, 5]
    assert metrics == {"dynamic_sampling_kept_samples": 3, "dynamic_sampling_kept_fraction": 0.5}
    with pytest.raises(ValueError, match="std has 2 entries"):
        dynamic_sampling_filter(batch, std[:2])


def test_dynamic_sampling_accumulation():
    first = BatchedDataDict(idx=[0, 1])
    second = BatchedDataDict(idx=[2, 3, 4])
    batch, done = accumulate_dynamic_sampling_batch(None, first, target_size=4)
    assert not done and batch["idx"] == [0, 1]
    batch, done = accumulate_dynamic_sampling_batch(batch, second, target_size=4)
    assert done and batch["idx"] == [0, 1, 2, 3]


def test_overlong_filtering():
    mask = torch.tensor([1.0, 1.0, 0.0])
    assert apply_overlong_filtering(mask, [True, False, False]).tolist() == [0.0, 1.0, 0.0]
    assert mask.tolist() == [1.0, 1.0, 0.0]  # pure: the input is untouched
    with pytest.raises(ValueError, match="truncated"):
        apply_overlong_filtering(mask, [True])


def test_metric_normalizers():
    metrics = [{"loss": 0.25, "peak": 3.0, "lr": 1.0}, {"loss": 0.5, "peak": 5.0, "lr": 3.0}]
    combined = aggregate_microbatch_metrics(
        metrics, {"peak": MetricNormalizer.MAX, "lr": MetricNormalizer.MEAN}
    )
    assert combined == {"loss": 0.75, "peak": 5.0, "lr": 2.0}
    assert MetricNormalizer.MIN.reduce([3.0, 1.0]) == 1.0


def test_nemo_rl_yaml_sections_validate_unchanged():
    raw = yaml.safe_load(NEMO_RL_GRPO_YAML)
    loss_cfg = validate_section(ClippedPGLossConfig, raw["loss_fn"], "loss_fn")
    assert loss_cfg == ClippedPGLossConfig()  # the YAML spells out NeMo RL's defaults
    grpo = validate_section(GRPOConfig, raw["grpo"], "grpo")
    assert grpo.reward_shaping.max_response_length == 512
    assert grpo.resolved_adv_estimator().use_leave_one_out_baseline is True
    assert ClippedPGLossFn(raw["loss_fn"]).cfg == loss_cfg


class RewardsOnly(GRPOConfig):
    num_prompts_per_step: int = 1
    num_generations_per_prompt: int = 1
    max_num_steps: int = 1


def test_config_errors_name_nested_paths():
    with pytest.raises(
        ValueError, match=r"grpo\.reward_shaping\.overlong_bufer_length: Extra inputs"
    ):
        validate_section(RewardsOnly, {"reward_shaping": {"overlong_bufer_length": 3}}, "grpo")
    with pytest.raises(
        ValueError, match=r"ppo\.adv_estimator\.gae_lambda: .*less than or equal to 1.*got 1.5"
    ):
        validate_section(PPOAdvEstimatorConfig, {"gae_lambda": 1.5}, "ppo.adv_estimator")
    with pytest.raises(ValueError, match="expected a mapping"):
        validate_section(PPOAdvEstimatorConfig, [1, 2], "ppo.adv_estimator")


def _kl_gradient(pg_data, on_policy_approximation: bool) -> float:
    # log pi = log 0.5, log pi_gen = 0, log pi_ref = log 0.25: k1 KL = log 2
    data, lp = pg_data([[math.log(0.5)]], [[0.0]], is_ratios=[[0.5]], reference=[[math.log(0.25)]])
    loss_fn = ClippedPGLossFn(
        {
            "reference_policy_kl_penalty": 1.0,
            "reference_policy_kl_type": "k1",
            "use_on_policy_kl_approximation": on_policy_approximation,
        }
    )
    loss, _ = loss_fn(
        next_token_logprobs=lp,
        data=data,
        global_valid_seqs=torch.tensor(1.0),
        global_valid_toks=torch.tensor(1.0),
    )
    loss.backward()
    return lp.grad.item()


def test_kl_gradient_carries_the_sampling_distributions_score(pg_data):
    # KL is sampled from pi itself: w = exp(lp - sg(lp)) = 1 keeps d w / d lp = w, so
    # d(w KL)/d lp = KL + 1 (a detached weight gave 1: 17.6% off in NeMo RL's own test)
    assert _kl_gradient(pg_data, False) == pytest.approx(math.log(2) + 1)


def test_on_policy_kl_weight_is_not_detached(pg_data):
    # w = pi / pi_gen = 0.5 with its gradient: d(w KL)/d lp = w KL + w
    assert _kl_gradient(pg_data, True) == pytest.approx(0.5 * math.log(2) + 0.5)


def test_nemo_gym_switches_off_leave_the_environment_sections_alone():
    """NeMo RL's ``env.should_use_nemo_gym: false`` (and the response logging read only on
    NeMo Gym's path) beside the sections: the config loads with its environments as they
    were; switched on, it is refused (tests/reliability/test_bad_input.py)."""
    switches = ["++env.should_use_nemo_gym=false", "++env.should_log_nemo_gym_responses=true"]
    config = load_master_config(str(TINY_GRPO), switches)
    assert config.env == load_master_config(str(TINY_GRPO)).env
    assert set(config.env) == {"math"}
