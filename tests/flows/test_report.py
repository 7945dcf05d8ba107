"""The report of an iteration from its manifest metrics: NeMo RL's logger names and steps,
the terminal line, the summary table and the PNG of the curves."""

import pyarrow as pa
import pytest

from flows.progress import (
    ITERATIONS_IN_ARTIFACT,
    ROLLOUTS_IN_ARTIFACT,
    TEXT_IN_ARTIFACT,
    artifact_key,
    artifact_rollout_rows,
    recent_summaries,
)
from flows.report import (
    IterationSummary,
    format_line,
    nemo_rl_records,
    plot_curves,
    summary_table,
)

# A GRPO iteration with validation and one dynamic-sampling refill round, as
# ``manifest_metrics`` flattens its manifest.
METRICS = {
    "validate/accuracy": 0.25,
    "validate/greedy_accuracy": 0.5,
    "seconds/validate": 4.0,
    "prompts/num_samples": 16.0,
    "seconds/prompts": 0.5,
    "generate/mean_gen_tokens_per_sample": 20.0,
    "seconds/generate": 2.0,
    "reward/mean_reward": 0.375,
    "reward/env_error_count": 0.0,
    "seconds/reward": 0.5,
    "prompts.1/num_samples": 16.0,
    "seconds/prompts.1": 0.5,
    "generate.1/mean_gen_tokens_per_sample": 10.0,
    "seconds/generate.1": 2.0,
    "reward.1/mean_reward": 0.5,
    "seconds/reward.1": 0.5,
    "logprob/unused": 1.0,
    "seconds/logprob": 1.0,
    "advantage/mean_baseline": 0.4,
    "seconds/advantage": 0.0,
    "train/loss": 0.125,
    "train/kl_penalty": 0.01,
    "train/probs_ratio_clamped_fraction": 0.0625,
    "train/approx_entropy": 2.5,
    "train/value_loss": 3.0,
    "seconds/train": 1.0,
    "checkpoint/checkpoints_kept": 2.0,
    "seconds/checkpoint": 0.0,
}


def test_records_carry_nemo_rl_names_and_steps():
    records = {record.prefix: record for record in nemo_rl_records(METRICS, iteration=3)}
    assert set(records) == {
        "validation",
        "timing/validation",
        "train",
        "timing/train",
        "performance",
    }
    # Validation measures the weights iteration 3 starts from: NeMo RL's step 3.
    assert records["validation"].step == 3
    assert records["validation"].metrics == {"accuracy": 0.25, "greedy_accuracy": 0.5}
    assert records["timing/validation"].metrics == {"total_validation_time": 4.0}
    # Training makes the policy of step 4.
    train = records["train"]
    assert train.step == 4
    assert train.metrics["reward"] == 0.5  # the last refill round's
    assert train.metrics["mean_gen_tokens_per_sample"] == 10.0
    assert train.metrics["critic/loss"] == 3.0 and "value_loss" not in train.metrics
    assert {"loss", "kl_penalty", "probs_ratio_clamped_fraction", "approx_entropy"} <= set(
        train.metrics
    )
    assert records["timing/train"].metrics == pytest.approx(
        {
            "data_processing": 1.0,
            "generation": 4.0,
            "reward_calculation": 1.0,
            "policy_and_reference_logprobs": 1.0,
            "advantage_calculation": 0.0,
            "policy_training": 1.0,
            "checkpointing": 0.0,
            "total_step_time": 8.0,
        }
    )
    # 16 x 20 + 16 x 10 generated tokens in 2 + 2 seconds; 16 samples in the 8 s step.
    assert records["performance"].metrics == pytest.approx(
        {"generated_tokens_per_sec": 120.0, "samples_per_sec": 2.0}
    )


def test_validation_after_the_last_step_logs_no_training():
    after_last = {
        "validate/accuracy": 0.5,
        "seconds/validate": 1.0,
        "checkpoint/checkpoints_kept": 3.0,
    }
    prefixes = [record.prefix for record in nemo_rl_records(after_last, iteration=5)]
    assert prefixes == ["validation", "timing/validation"]


def test_terminal_line_shows_what_was_measured():
    line = format_line(IterationSummary.from_metrics(3, METRICS))
    assert line.startswith("iter   3 | reward 0.375 | val acc 0.250 (greedy 0.500) | loss 0.125")
    assert "| kl 0.01 | clip 0.062 | entropy 2.5 | gen len 20.0 | gen tok/s 120 |" in line
    assert line.endswith(
        "| 12.0 s (validate 4.0 prompts 0.5 generate 2.0 reward 0.5 "
        "prompts.1 0.5 generate.1 2.0 reward.1 0.5 logprob 1.0 "
        "advantage 0.0 train 1.0 checkpoint 0.0)"
    )
    quiet = format_line(IterationSummary.from_metrics(0, {"seconds/validate": 1.0}))
    assert quiet == "iter   0 | 1.0 s (validate 1.0)"


def test_preference_validation_shows_the_default_set_else_the_first_named_one():
    default = {
        "validate/validation-default_accuracy": 0.75,
        "validate/validation-default_loss": 0.5,
    }
    named = {"validate/validation-short_accuracy": 0.25, "validate/validation-long_accuracy": 0.5}
    assert IterationSummary.from_metrics(1, default).val_accuracy == 0.75
    assert IterationSummary.from_metrics(1, default).val_loss == 0.5
    assert IterationSummary.from_metrics(1, named).val_accuracy == 0.5  # "long" sorts first
    assert IterationSummary.from_metrics(1, named).val_loss is None


def test_scaled_rewards_show_both_and_log_the_scaled_one_as_nemo_rl_does():
    """With reward scaling or shaping on, the stored total_reward (what the advantages use,
    NeMo RL's train/reward) differs from the environments' mean: both show, each named."""
    metrics = {"reward/mean_reward": 0.25, "reward/mean_total_reward": -0.5, "train/loss": 1.0}
    line = format_line(IterationSummary.from_metrics(0, metrics))
    assert line.startswith("iter   0 | reward 0.250 (scaled/shaped total_reward -0.500) |")
    train = {record.prefix: record for record in nemo_rl_records(metrics, 0)}["train"]
    assert train.metrics["reward"] == -0.5 and train.metrics["env_reward"] == 0.25
    table = summary_table("run-s", [IterationSummary.from_metrics(0, metrics)])
    assert table.splitlines()[1].split()[:4] == ["iter", "reward", "total", "rwd"]
    assert "mean total_reward" not in summary_table("run-a", summaries())


def test_tiny_rewards_do_not_print_as_zero():
    line = format_line(IterationSummary.from_metrics(0, {"reward/mean_reward": 1.2e-5}))
    assert line.startswith("iter   0 | reward 1.20e-05 |")
    assert "reward 0.000" in format_line(
        IterationSummary.from_metrics(0, {"reward/mean_reward": 0})
    )


def summaries() -> list[IterationSummary]:
    rewards = [0.125, 0.25, 0.5]
    return [
        IterationSummary.from_metrics(
            i,
            {"reward/mean_reward": r, "train/loss": 1 - r, "seconds/train": 1.0}
            | ({"validate/accuracy": r / 2} if i != 1 else {}),
        )
        for i, r in enumerate(rewards)
    ]


def test_summary_table_lists_each_iteration_and_the_movement():
    text = summary_table("run-a", summaries())
    lines = text.splitlines()
    assert lines[0] == "run run-a: 3 iterations"
    assert lines[1].split() == [
        "iter", "reward", "val", "acc", "greedy", "val", "loss", "loss", "kl", "clip", "entropy",
        "gen", "len", "tok/s", "seconds",
    ]  # fmt: skip
    assert lines[4].split() == ["1", "0.250", "-", "-", "-", "0.75", "-", "-", "-", "-", "-", "1.0"]
    assert "mean reward: 0.125 (iter 0) -> 0.500 (iter 2)" in lines
    assert "validation accuracy: 0.062 (iter 0) -> 0.250 (iter 2)" in lines


def test_curves_png(tmp_path):
    path = plot_curves("run-a", summaries(), tmp_path / "logs" / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_artifact_keys_are_lowercase_letters_digits_and_dashes():
    assert artifact_key("GRPO_run.1", "rollouts", "iter", 3) == "grpo-run-1-rollouts-iter-3"


def test_the_rollouts_artifact_shows_the_first_samples_with_texts_cut():
    rows = ROLLOUTS_IN_ARTIFACT + 36
    rollouts = pa.table(
        {"sample": list(range(rows)), "response": ["x" * (TEXT_IN_ARTIFACT + 10)] * rows}
    )
    shown = artifact_rollout_rows(rollouts)
    assert [row["sample"] for row in shown] == list(range(ROLLOUTS_IN_ARTIFACT))
    assert shown[0]["response"] == "x" * TEXT_IN_ARTIFACT + " ..."


def test_the_metrics_artifact_shows_the_last_iterations_in_order():
    summaries = {i: IterationSummary.from_metrics(i, METRICS) for i in range(150)}
    shown = recent_summaries(dict(reversed(summaries.items())))
    assert [s.iteration for s in shown] == list(range(150 - ITERATIONS_IN_ARTIFACT, 150))
