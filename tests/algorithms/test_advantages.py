"""Baselines and advantage estimators against values worked by hand."""

import math
import statistics

import pytest
import torch

from nemo_rl_core.algorithms.advantage_estimator import (
    GDPOAdvantageEstimator,
    GeneralizedAdvantageEstimator,
    GRPOAdvantageEstimator,
    ReinforcePlusPlusAdvantageEstimator,
    create_advantage_estimator,
)
from nemo_rl_core.algorithms.config import GRPOAdvantageConfig, PPOAdvEstimatorConfig
from nemo_rl_core.algorithms.grpo import clip_advantages
from nemo_rl_core.algorithms.utils import calculate_baseline_and_std_per_prompt

REWARDS = [1.0, 2.0, 3.0, 6.0]


def gae(**keys) -> PPOAdvEstimatorConfig:
    return PPOAdvEstimatorConfig(**{"normalize_advantages": False, **keys})


def test_vapo_decoupled_lambdas_and_length_adaptive_policy_lambda():
    values = torch.tensor([[0.0, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    plain = GeneralizedAdvantageEstimator(gae(gae_lambda=0.5))
    adv_05, ret_05 = plain.compute_advantage(None, torch.tensor([1.0]), mask, values)
    _, ret_1 = GeneralizedAdvantageEstimator(gae(gae_lambda=1.0)).compute_advantage(
        None, torch.tensor([1.0]), mask, values
    )
    # VAPO: returns from lambda_value, advantages from lambda_policy
    vapo = GeneralizedAdvantageEstimator(
        gae(gae_lambda=0.9, gae_lambda_value=1.0, gae_lambda_policy=0.5)
    )
    adv, ret = vapo.compute_advantage(None, torch.tensor([1.0]), mask, values)
    assert torch.allclose(adv, adv_05) and torch.allclose(ret[:, 1:], ret_1[:, 1:])
    # lambda_policy = 1 - 1 / (alpha * length) per sample: lengths 3 and 8 with alpha 0.5
    adaptive = GeneralizedAdvantageEstimator(gae(length_adaptive_alpha=0.5))
    lengths_mask = torch.zeros(2, 10)
    lengths_mask[0, :3], lengths_mask[1, :8] = 1, 1
    resolved = adaptive._resolve_lambda_policy(lengths_mask)
    assert resolved.tolist() == pytest.approx([1 - 1 / 1.5, 1 - 1 / 4.0])


def test_leave_one_out_baseline_and_bessel_std():
    prompts = torch.tensor([[7, 8]] * 4)
    baseline, std = calculate_baseline_and_std_per_prompt(
        prompts, torch.tensor(REWARDS), torch.ones(4), leave_one_out_baseline=True
    )
    for i in range(4):
        others = REWARDS[:i] + REWARDS[i + 1 :]
        assert baseline[i].item() == pytest.approx(sum(others) / 3)
        assert std[i].item() == pytest.approx(statistics.stdev(others))
    assert baseline.tolist() == pytest.approx([11 / 3, 10 / 3, 3.0, 2.0])


def test_mean_baseline_and_groups():
    # two prompts interleaved; group A = (1, 3), group B = (2, 6)
    prompts = torch.tensor([[1, 2], [3, 4], [1, 2], [3, 4]])
    baseline, std = calculate_baseline_and_std_per_prompt(
        prompts, torch.tensor(REWARDS), torch.ones(4), leave_one_out_baseline=False
    )
    assert baseline.tolist() == pytest.approx([2.0, 4.0, 2.0, 4.0])
    assert std.tolist() == pytest.approx([math.sqrt(2), math.sqrt(8), math.sqrt(2), math.sqrt(8)])


def test_invalid_samples_and_singleton_groups():
    prompts = torch.tensor([0, 0, 0, 1])
    rewards = torch.tensor([1.0, 5.0, 3.0, 4.0])
    valid = torch.tensor([1.0, 0.0, 1.0, 1.0])
    baseline, std = calculate_baseline_and_std_per_prompt(prompts, rewards, valid, True)
    # sample 1 is invalid: nobody's reference set holds it. NeMo RL divides every sample's
    # leave-one-out sum by (valid count - 1) = 1, its own too: (1 + 3) / 1 = 4 (we gave 2)
    assert baseline.tolist() == pytest.approx([3.0, 4.0, 1.0, 4.0])
    assert std.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0])
    # a group with <= 1 valid sample: baseline = reward, std = 0
    baseline, std = calculate_baseline_and_std_per_prompt(
        prompts, rewards, torch.tensor([1.0, 0.0, 0.0, 1.0]), False
    )
    assert baseline.tolist() == pytest.approx([1.0, 5.0, 3.0, 4.0])
    assert std.tolist() == [0.0] * 4


def test_grpo_estimator_normalizes_only_nonzero_std():
    prompts = torch.tensor([0, 0, 0, 1, 1, 1])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    mask = torch.ones(6, 3)
    est = GRPOAdvantageEstimator({"use_leave_one_out_baseline": False, "normalize_rewards": True})
    adv = est.compute_advantage(prompts, rewards, mask)
    std = statistics.stdev([1.0, 0.0, 0.0]) + 1e-6  # NeMo RL's epsilon
    expected = [(1 - 1 / 3) / std, -1 / 3 / std, -1 / 3 / std, 0.0, 0.0, 0.0]
    assert adv.shape == (6, 3)
    assert adv[:, 0].tolist() == pytest.approx(expected)
    assert torch.equal(adv[:, 0], adv[:, 2])
    unnormalized = GRPOAdvantageEstimator(
        {"use_leave_one_out_baseline": False, "normalize_rewards": False}
    )
    assert unnormalized.compute_advantage(prompts, rewards, mask)[:, 0].tolist() == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]
    )


def test_grpo_advantage_clipping_at_the_sections_keys():
    loop = GRPOAdvantageConfig(advantage_clip_low=-0.5, advantage_clip_high=1.0)
    clipped = clip_advantages(torch.tensor([1.7, -0.4, -0.9, 0.0]), loop)
    assert clipped.tolist() == pytest.approx([1.0, -0.4, -0.5, 0.0])
    with pytest.raises(ValueError, match="advantage_clip_low"):
        GRPOAdvantageConfig(advantage_clip_low=-1.0, advantage_clip_high=-2.0)


def test_grpo_section_fallbacks_and_factory():
    cfg = GRPOAdvantageConfig.model_validate({"use_leave_one_out_baseline": False})
    resolved = cfg.resolved_adv_estimator()
    assert resolved.use_leave_one_out_baseline is False and resolved.normalize_rewards is True
    assert isinstance(create_advantage_estimator(resolved), GRPOAdvantageEstimator)
    est = create_advantage_estimator({"name": "reinforce_plus_plus", "minus_baseline": True})
    assert isinstance(est, ReinforcePlusPlusAdvantageEstimator)
    with pytest.raises(ValueError, match="adv_estimator.name 'ppo' is not one of"):
        create_advantage_estimator({"name": "ppo"})


def test_gdpo_normalises_each_component_then_standardises_their_sum():
    """Two prompts of two samples. Component 1 has a large spread on prompt 0, component 2 a
    small one on prompt 1; each becomes +-1/sqrt(2) within its prompt (Bessel std) before the
    sum, so neither drowns the other; the sum is then standardised over the batch."""
    estimator = create_advantage_estimator(
        {"name": "gdpo", "use_leave_one_out_baseline": False, "normalize_rewards": True}
    )
    assert isinstance(estimator, GDPOAdvantageEstimator)
    components = {
        "reward1": torch.tensor([10.0, 0.0, 1.0, 1.0]),
        "reward2": torch.tensor([0.0, 0.0, 0.2, 0.1]),
    }
    mask = torch.ones(4, 3)
    got = estimator.compute_advantage(torch.tensor([0, 0, 1, 1]), None, mask, components)
    half = 1 / math.sqrt(2)
    summed = torch.tensor([half, -half, half, -half])
    expected = (summed - summed.mean()) / summed.std()
    assert got.shape == (4, 3)
    torch.testing.assert_close(got[:, 0], expected, atol=1e-5, rtol=0)
    assert torch.equal(got[:, 0], got[:, 2])  # one value per sample, on every token
    # every sample's sum equal (no component varies within a prompt): only centred, all 0
    flat = {"reward1": torch.ones(4), "reward2": torch.zeros(4)}
    assert estimator.compute_advantage(torch.tensor([0, 0, 1, 1]), None, mask, flat).eq(0).all()


def test_gdpo_refuses_a_batch_of_one_reward_naming_the_way_out():
    estimator = create_advantage_estimator(
        {"name": "gdpo", "use_leave_one_out_baseline": True, "normalize_rewards": True}
    )
    with pytest.raises(ValueError, match=r"has 1: score with a multi-reward environment"):
        estimator.compute_advantage(
            torch.tensor([0, 0]), None, torch.ones(2, 2), {"reward1": torch.ones(2)}
        )


def test_reinforce_plus_plus_hand_values():
    prompts = torch.tensor([0, 0])
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    est = ReinforcePlusPlusAdvantageEstimator({"minus_baseline": True}, {})
    # minus group mean -> (0.5, -0.5) on every token; whitened over the response tokens:
    # mean 0, std 0.5 (positions outside the mask are whitened too; the loss masks them)
    adv = est.compute_advantage(prompts, rewards, mask)
    assert adv.tolist() == [pytest.approx([1.0] * 3), pytest.approx([-1.0] * 3)]


def test_reinforce_plus_plus_kl_in_reward():
    prompts = torch.tensor([0, 1])
    rewards = torch.tensor([1.0, 1.0])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    policy = torch.zeros(2, 3)
    reference = torch.tensor([[0.0, -1.0, -1.0], [0.0, 0.0, 0.0]])  # k1 = 1 on row 0
    est = ReinforcePlusPlusAdvantageEstimator(
        {"name": "reinforce_plus_plus", "minus_baseline": False},
        {
            "use_kl_in_reward": True,
            "reference_policy_kl_penalty": 0.5,
            "reference_policy_kl_type": "k1",
        },
    )
    adv = est.compute_advantage(
        prompts, rewards, mask, logprobs_policy=policy, logprobs_reference=reference
    )
    # per token R - beta k1: row 0 (0.5, 0.5), row 1 (1, 1) -> whitened (-1, -1, 1, 1)
    assert adv[:, 1:].flatten().tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0])
    # without the logprobs there is no KL to add (NeMo RL's behaviour)
    assert est.compute_advantage(prompts, rewards, mask)[:, 1:].abs().sum() == 0


def test_gae_four_step_episode_by_hand():
    # prompt token, then 4 response tokens; gamma 0.9, lambda 0.8, terminal reward 1
    values = torch.tensor([[9.0, 0.2, 0.4, 0.6, 0.8]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0]])
    est = GeneralizedAdvantageEstimator(gae(gae_gamma=0.9, gae_lambda=0.8))
    adv, ret = est.compute_advantage(None, torch.tensor([1.0]), mask, values)
    # delta_4 = 1 - 0.8 = 0.2                       A_4 = 0.2
    # delta_3 = 0.9*0.8 - 0.6 = 0.12                A_3 = 0.12 + 0.72*0.2    = 0.264
    # delta_2 = 0.9*0.6 - 0.4 = 0.14                A_2 = 0.14 + 0.72*0.264  = 0.33008
    # delta_1 = 0.9*0.4 - 0.2 = 0.16                A_1 = 0.16 + 0.72*0.33008 = 0.3976576
    assert adv[0].tolist() == pytest.approx([0.0, 0.3976576, 0.33008, 0.264, 0.2])
    assert ret[0, 1:].tolist() == pytest.approx([0.5976576, 0.73008, 0.864, 1.0])


def test_gae_skips_masked_tokens_and_normalizes():
    # an environment token (masked) between two policy tokens is skipped, not a step
    values = torch.tensor([[0.0, 0.5, 7.0, 0.5]])
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    est = GeneralizedAdvantageEstimator(gae(gae_gamma=1.0, gae_lambda=1.0))
    adv, _ = est.compute_advantage(None, torch.tensor([2.0]), mask, values)
    assert adv[0].tolist() == pytest.approx([0.0, 1.5, 0.0, 1.5])
    normalized = GeneralizedAdvantageEstimator(gae(normalize_advantages=True))
    values = torch.tensor([[0.0, 0.1, 0.3], [0.0, 0.2, 0.9]])
    adv, _ = normalized.compute_advantage(
        None, torch.tensor([1.0, 0.0]), torch.tensor([[0, 1.0, 1], [0, 1, 1]]), values=values
    )
    valid = adv[:, 1:]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.var(unbiased=True).item() == pytest.approx(1.0, abs=1e-5)  # NeMo RL: unbiased
    assert adv[:, 0].tolist() == [0.0, 0.0]


def test_gae_kl_in_reward():
    values = torch.zeros(1, 3)
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    est = GeneralizedAdvantageEstimator(
        gae(gae_gamma=1.0, gae_lambda=1.0),
        {
            "use_kl_in_reward": True,
            "reference_policy_kl_penalty": 0.1,
            "reference_policy_kl_type": "k1",
        },
    )
    adv, _ = est.compute_advantage(
        None,
        torch.tensor([1.0]),
        mask,
        values,
        logprobs=torch.zeros(1, 3),
        reference_logprobs=torch.full((1, 3), -2.0),
    )
    # token rewards: -0.2, 1 - 0.2
    assert adv[0].tolist() == pytest.approx([0.0, 0.6, 0.8])
