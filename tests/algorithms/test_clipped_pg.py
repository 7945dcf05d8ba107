"""ClippedPGLossFn against hand-computed values, one knob at a time."""

import math

import pytest
import torch

from nemo_rl_core.algorithms.loss import ClippedPGLossFn, LossType
from nemo_rl_core.algorithms.utils import calculate_global_valid_counts, calculate_kl

LOG_HALF = math.log(0.5)
NO_KL = {"reference_policy_kl_penalty": 0.0}


def run(cfg: dict, data, logprobs):
    loss_fn = ClippedPGLossFn(cfg)
    seqs, toks = calculate_global_valid_counts(data)
    return loss_fn(
        next_token_logprobs=logprobs, data=data, global_valid_seqs=seqs, global_valid_toks=toks
    )


def test_ratio_clipping_hand_values(pg_data):
    # ratios 0.5 / 1.0 / 1.5 with clip 0.2 -> clamped 0.8 / 1.0 / 1.2
    data, lp = pg_data([[LOG_HALF] * 3], [[1.0] * 3], ratios=[[0.5, 1.0, 1.5]])
    loss, metrics = run(NO_KL, data, lp)
    # max(-r, -clamp(r)) = -0.5, -1.0, -1.2
    assert loss.item() == pytest.approx((-0.5 - 1.0 - 1.2) / 3)
    assert metrics["probs_ratio"] == pytest.approx(1.0)
    assert metrics["probs_ratio_clamped"] == pytest.approx((0.8 + 1.0 + 1.2) / 3)
    assert metrics["probs_ratio_clamped_fraction"] == pytest.approx(2 / 3)  # 0.5 and 1.5
    assert (metrics["probs_ratio_min"], metrics["probs_ratio_max"]) == pytest.approx((0.5, 1.5))
    assert (metrics["probs_ratio_clamped_min"], metrics["probs_ratio_clamped_max"]) == (
        pytest.approx((0.8, 1.2))
    )

    data, lp = pg_data([[LOG_HALF] * 3], [[-1.0] * 3], ratios=[[0.5, 1.0, 1.5]])
    loss, metrics = run(NO_KL, data, lp)
    # max(r, clamp(r)) = 0.8, 1.0, 1.5
    assert loss.item() == pytest.approx((0.8 + 1.0 + 1.5) / 3)


def test_asymmetric_clip(pg_data):
    data, lp = pg_data([[LOG_HALF] * 2], [[1.0] * 2], ratios=[[1.5, 0.5]])
    loss, _ = run({**NO_KL, "ratio_clip_min": 0.1, "ratio_clip_max": 0.3}, data, lp)
    # A > 0: max(-1.5, -1.3) = -1.3; max(-0.5, -0.9) = -0.5
    assert loss.item() == pytest.approx((-1.3 - 0.5) / 2)


def test_dual_clip(pg_data):
    data, lp = pg_data([[LOG_HALF] * 3], [[-1.0, -1.0, 1.0]], ratios=[[5.0, 2.0, 5.0]])
    loss, _ = run({**NO_KL, "ratio_clip_c": 3.0}, data, lp)
    # A<0, r=5: min(max(5, 1.2), 3) = 3; A<0, r=2: min(2, 3) = 2; A>0: max(-5, -1.2) = -1.2
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    loss_off, _ = run(NO_KL, data, lp)
    assert loss_off.item() == pytest.approx((5.0 + 2.0 - 1.2) / 3)


@pytest.mark.parametrize(
    ("kl_type", "expected"),
    [("k1", math.log(2)), ("k2", math.log(2) ** 2 / 2), ("k3", 0.5 - 1 + math.log(2))],
)
def test_kl_estimators(pg_data, kl_type, expected):
    # pi = 0.5, pi_ref = 0.25: log r = log(pi_ref / pi) = -log 2
    logp, logref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert calculate_kl(logp, logref, kl_type).item() == pytest.approx(expected)
    data, lp = pg_data([[LOG_HALF]], [[0.0]], reference=[[math.log(0.25)]])
    loss, metrics = run(
        {"reference_policy_kl_penalty": 0.1, "reference_policy_kl_type": kl_type}, data, lp
    )
    assert loss.item() == pytest.approx(0.1 * expected)
    assert metrics["kl_penalty"] == pytest.approx(expected)


def test_kl_clamps():
    logp, logref = torch.tensor([0.0]), torch.tensor([-3.0])
    # input clamp: log r = -3 -> -1, k1 = 1
    assert calculate_kl(logp, logref, "k1", input_clamp_value=1.0).item() == pytest.approx(1.0)
    # output clamp: k2 = 9 / 2 = 4.5 -> 2
    assert calculate_kl(logp, logref, "k2", None, output_clamp_value=2.0).item() == pytest.approx(
        2.0
    )
    assert calculate_kl(logp, logref, "k2", None, None).item() == pytest.approx(4.5)


def test_on_policy_kl_approximation(pg_data):
    # ratio 1 and pi_old / pi_gen = 0.5, so the on-policy weight pi / pi_gen = 0.5
    data, lp = pg_data([[LOG_HALF]], [[0.0]], is_ratios=[[0.5]], reference=[[math.log(0.25)]])
    cfg = {"reference_policy_kl_penalty": 1.0, "reference_policy_kl_type": "k1"}
    loss_plain, _ = run(cfg, data, lp)
    loss_approx, _ = run({**cfg, "use_on_policy_kl_approximation": True}, data, lp)
    assert loss_plain.item() == pytest.approx(math.log(2))
    assert loss_approx.item() == pytest.approx(0.5 * math.log(2))


def test_kl_in_reward_removes_kl_term(pg_data):
    data, lp = pg_data([[LOG_HALF]], [[1.0]], reference=[[math.log(0.25)]])
    del data["reference_policy_logprobs"]
    loss, metrics = run({"reference_policy_kl_penalty": 0.5, "use_kl_in_reward": True}, data, lp)
    assert loss.item() == pytest.approx(-1.0)
    assert metrics["kl_penalty"] == 0.0


@pytest.mark.parametrize(
    ("tis", "expected_weights"),
    [
        ({}, [1.0, 1.0, 1.0]),  # correction off
        ({"use_importance_sampling_correction": True}, [0.5, 1.0, 3.0]),
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "tis",
                "truncated_importance_sampling_ratio": 2.0,
            },
            [0.5, 1.0, 2.0],
        ),
        # NeMo RL's lower TIS bound: weights below it are raised to it
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "tis",
                "truncated_importance_sampling_ratio": 2.0,
                "truncated_importance_sampling_ratio_min": 0.8,
            },
            [0.8, 1.0, 2.0],
        ),
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "icepop",
                "truncated_importance_sampling_ratio": 2.0,
                "truncated_importance_sampling_ratio_min": 0.8,
            },
            [0.0, 1.0, 0.0],
        ),
        # geometric mean of (0.5, 1, 3) = 1.5 ** (1/3) = 1.145: inside [0.8, 2] keeps all
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "seq-mask-tis",
                "truncated_importance_sampling_ratio": 2.0,
                "truncated_importance_sampling_ratio_min": 0.8,
            },
            [0.5, 1.0, 3.0],
        ),
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "seq-mask-tis",
                "truncated_importance_sampling_ratio": 1.1,
                "truncated_importance_sampling_ratio_min": 0.8,
            },
            [0.0, 0.0, 0.0],
        ),
    ],
)
def test_importance_sampling_correction(pg_data, tis, expected_weights):
    data, lp = pg_data([[LOG_HALF] * 3], [[1.0] * 3], is_ratios=[[0.5, 1.0, 3.0]])
    loss, metrics = run({**NO_KL, **tis}, data, lp)
    # ratio 1 and A = 1: every token contributes -w_t
    assert loss.item() == pytest.approx(-sum(expected_weights) / 3)
    if tis:
        assert metrics["sampling_importance_ratio"] == pytest.approx(sum(expected_weights) / 3)


def test_gspo_sequence_ratio(pg_data):
    # log ratios (log 1.21, 0): geometric mean = sqrt(1.21) = 1.1 on both tokens
    data, lp = pg_data(
        [[LOG_HALF] * 2, [LOG_HALF] * 2], [[1.0] * 2, [-1.0] * 2], ratios=[[1.21, 1.0], [1.0, 1.0]]
    )
    cfg = {**NO_KL, "sequence_level_importance_ratios": True, "token_level_loss": False}
    loss_fn = ClippedPGLossFn(cfg)
    assert loss_fn.loss_type == LossType.SEQUENCE_LEVEL
    loss, _ = run(cfg, data, lp)
    assert loss.item() == pytest.approx((-1.1 + 1.0) / 2)
    loss, _ = run({**cfg, "ratio_clip_max": 0.05}, data, lp)
    assert loss.item() == pytest.approx((-1.05 + 1.0) / 2)


def test_gspo_importance_weight_is_the_sequences_product(pg_data):
    # pi_old / pi_gen = 2 and 3 on the two tokens: GSPO weighs the whole sequence by their
    # product exp(sum log ratio) = 6 (a mean of the logs, sqrt(6), was ours before)
    data, lp = pg_data([[LOG_HALF] * 2], [[1.0] * 2], is_ratios=[[2.0, 3.0]])
    cfg = {
        **NO_KL,
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
        "use_importance_sampling_correction": True,
    }
    loss, metrics = run(cfg, data, lp)
    assert loss.item() == pytest.approx(-6.0)  # ratio 1, A = 1: -w on every token
    assert metrics["sampling_importance_ratio"] == pytest.approx(6.0)


def test_disable_ppo_ratio_is_reinforce(pg_data):
    data, lp = pg_data([[LOG_HALF, math.log(0.25)]], [[2.0, -1.0]], ratios=[[3.0, 3.0]])
    loss, _ = run({**NO_KL, "disable_ppo_ratio": True}, data, lp)
    assert loss.item() == pytest.approx((-2.0 * LOG_HALF + math.log(0.25)) / 2)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.0, 0.5])


def test_force_on_policy_ratio(pg_data):
    data, lp = pg_data([[LOG_HALF, LOG_HALF]], [[2.0, -1.0]], ratios=[[3.0, 0.1]])
    loss, _ = run({**NO_KL, "force_on_policy_ratio": True}, data, lp)
    assert loss.item() == pytest.approx((-2.0 + 1.0) / 2)  # ratio is exactly 1
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.0, 0.5])  # -A / N: clipping never binds


def test_cispo_detached_clipped_weight(pg_data):
    data, lp = pg_data([[LOG_HALF, LOG_HALF]], [[1.0, 1.0]], ratios=[[1.5, 1.0]])
    loss, _ = run({**NO_KL, "use_cispo": True}, data, lp)
    assert loss.item() == pytest.approx(-(1.2 * LOG_HALF + 1.0 * LOG_HALF) / 2)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.6, -0.5])  # -A sg(clip(r)) / N


def test_positive_example_nll_is_over_correct_samples(pg_data):
    # VAPO: the NLL of samples whose reward is positive, averaged over their own tokens
    data, lp = pg_data([[LOG_HALF, math.log(0.25)], [LOG_HALF, LOG_HALF]], [[1.0, -1.0]] * 2)
    data["rewards"] = torch.tensor([1.0, 0.0])
    base, _ = run(NO_KL, data, lp)
    loss, metrics = run({**NO_KL, "positive_example_nll_weight": 0.5}, data, lp)
    nll = -(LOG_HALF + math.log(0.25)) / 2
    assert metrics["positive_nll_loss"] == pytest.approx(nll)
    assert loss.item() == pytest.approx(base.item() + 0.5 * nll)


def test_token_vs_sequence_level_and_masks(pg_data):
    # row 0 has 1 valid token (loss -1), row 1 has 3 (losses -2, -2, -2), row 2 masked out
    data, lp = pg_data(
        [[LOG_HALF] * 3] * 3,
        [[1.0, 9.0, 9.0], [2.0, 2.0, 2.0], [5.0, 5.0, 5.0]],
        token_mask=[[1, 0, 0], [1, 1, 1], [1, 1, 1]],
        sample_mask=[1.0, 1.0, 0.0],
    )
    token_loss, metrics = run(NO_KL, data, lp)
    assert token_loss.item() == pytest.approx((-1 - 6) / 4)
    assert metrics["num_valid_samples"] == 2
    seq_loss, _ = run({**NO_KL, "token_level_loss": False}, data, lp)
    assert seq_loss.item() == pytest.approx((-1 - 2) / 2)


def test_metrics_entropy_and_prob_error(pg_data):
    data, lp = pg_data([[LOG_HALF]], [[0.0]], is_ratios=[[0.5]])
    _, metrics = run(NO_KL, data, lp)
    # pi / pi_gen = 0.5 (gen = prev - log 0.5): -(0.5) * log 0.5
    assert metrics["approx_entropy"] == pytest.approx(-0.5 * LOG_HALF)
    assert metrics["token_mult_prob_error"] == pytest.approx(2.0)


def test_incompatible_knobs_assert_as_in_nemo_rl():
    with pytest.raises(AssertionError, match="ratio_clip_c must exceed 1"):
        ClippedPGLossFn({"ratio_clip_c": 0.5})
    with pytest.raises(AssertionError, match="token_level_loss"):
        ClippedPGLossFn({"sequence_level_importance_ratios": True})
    with pytest.raises(AssertionError, match="truncated_importance_sampling_ratio_min"):
        ClippedPGLossFn(
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "icepop",
                "truncated_importance_sampling_ratio": 2.0,
            }
        )


def test_unknown_or_mistyped_keys_are_named():
    with pytest.raises(ValueError, match="ratio_clip_mn"):
        ClippedPGLossFn({"ratio_clip_mn": 0.2})
    with pytest.raises(ValueError, match="reference_policy_kl_type"):
        ClippedPGLossFn({"reference_policy_kl_type": "k4"})
