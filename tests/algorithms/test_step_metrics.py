"""A training step's metrics: the microbatches' values reduced as NeMo RL reduces them, so
KL, ratios and entropy reach the logs whatever the microbatch size."""

import math

import pytest
import torch
from test_forward_shortcuts import CONFIG, rollouts
from transformers import AutoTokenizer

from nemo_rl_core.algorithms.grpo import (
    advantage_metrics,
    build_loss_fn,
    compute_advantages,
    compute_logprobs,
    load_master_config,
)
from nemo_rl_core.algorithms.training import merge_step_metrics
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy import make_policy


def test_hand_values():
    merged = merge_step_metrics(
        {
            "loss": torch.tensor([0.3, 0.2]),  # two global batches
            "grad_norm": torch.tensor([1.0, 3.0]),
            "all_mb_metrics": {
                "loss": [0.1, 0.2, 0.15, 0.05],
                "kl_penalty": [0.01, 0.02, 0.03, 0.04],
                "probs_ratio_min": [math.inf, 0.9, 0.8, math.inf],
                "probs_ratio_max": [-math.inf, -math.inf, -math.inf, -math.inf],
                "lr": [1e-3, 1e-3, 1e-3, 1e-3],
                "global_valid_toks": [40.0, 40.0, 60.0, 60.0],
            },
        }
    )
    assert merged == pytest.approx(
        {
            "loss": 0.5,
            "grad_norm": 4.0,
            "kl_penalty": 0.1,
            "probs_ratio_min": 0.8,  # the empty microbatches' +inf left out
            "probs_ratio_max": -1.0,  # every microbatch empty
            "lr": 1e-3,
            "global_valid_toks": 50.0,
        }
    )


def step_metrics(model_dir, micro_batch: int) -> dict[str, float]:
    """The metrics of one evaluation pass (no update) over a 16-sample batch."""
    config = load_master_config(CONFIG, [f"policy.model_name={model_dir}"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = make_policy(config.policy, tokenizer=tokenizer, init_optimizer=False)
    data = compute_logprobs(policy, rollouts(len(tokenizer)), tokenizer, config)
    data, _ = compute_advantages(data, config)
    # Older and reference policies unlike this one: ratios and KL away from 1 and 0.
    data["prev_logprobs"] = data["prev_logprobs"] - 0.3 * data["token_mask"]
    data["reference_policy_logprobs"] = data["reference_policy_logprobs"] + 0.5 * data["token_mask"]
    results = policy.train(data, build_loss_fn(config), eval_mode=True, mbs=micro_batch)
    return merge_step_metrics(results)


def test_merged_metrics_do_not_depend_on_the_microbatch_size(tiny_model_dir):
    one = step_metrics(tiny_model_dir, micro_batch=16)
    four = step_metrics(tiny_model_dir, micro_batch=4)
    for key in (
        "loss",
        "kl_penalty",
        "probs_ratio",
        "probs_ratio_clamped_fraction",
        "probs_ratio_min",
        "probs_ratio_max",
        "approx_entropy",
        "token_mult_prob_error",
        "num_valid_samples",
        "global_valid_toks",
    ):
        assert four[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    assert one["kl_penalty"] > 0 and one["probs_ratio_clamped_fraction"] > 0
    assert one["num_valid_samples"] == 16


def test_advantage_metrics_hand_values():
    data = BatchedDataDict(
        advantages=torch.tensor([[9.0, 1.0, -1.0], [9.0, 0.5, 9.0]]),
        token_mask=torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),  # prompt/padding: 9
        input_lengths=torch.tensor([3, 2]),
    )
    baseline = torch.tensor([0.0, 0.0, 1.0, 0.5])
    assert advantage_metrics(data, baseline) == pytest.approx(
        {
            "advantages/mean": 0.5 / 3,
            "advantages/max": 1.0,
            "advantages/min": -1.0,
            "advantages/sum": 0.5,
            "baseline_reward/pct_0": 50.0,
            "baseline_reward/pct_1": 25.0,
            "baseline_reward/pct_mixed": 25.0,
            "total_num_tokens": 5.0,
        }
    )
