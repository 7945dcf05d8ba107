"""Advantage estimators (``nemo_rl.algorithms.advantage_estimator``): GRPO, Reinforce++, GAE.

Each estimator maps per-sample rewards (and, where needed, per-token values or
log-probs) to per-token advantages [B, S] aligned with input_ids, ready to be stored as
``advantages`` for :class:`~nemo_rl_core.algorithms.loss.ClippedPGLossFn`.
"""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.config import (
    AdvEstimatorConfig,
    ClippedPGLossConfig,
    PPOAdvantageConfig,
    validate_section,
)
from nemo_rl_core.algorithms.utils import (
    calculate_baseline_and_std_per_prompt,
    calculate_kl,
    masked_mean,
)


class GRPOAdvantageEstimator:
    """A_i = (R_i - baseline_i) / std_i, the same value on every token of sample i.

    baseline/std come from the other samples of the same prompt
    (:func:`calculate_baseline_and_std_per_prompt`, leave-one-out by
    ``use_leave_one_out_baseline``). Division by std happens only with
    ``normalize_rewards`` and only where std > 0 (a group of equal rewards keeps A = 0).
    ``advantage_clip_low``/``_high`` clamp the result.
    """

    def __init__(
        self,
        estimator_config: AdvEstimatorConfig | Mapping[str, Any],
        loss_config: ClippedPGLossConfig | Mapping[str, Any] | None = None,
    ):
        cfg = validate_section(AdvEstimatorConfig, estimator_config, "grpo.adv_estimator")
        self.normalize_rewards = cfg.normalize_rewards is not False
        self.use_leave_one_out_baseline = cfg.use_leave_one_out_baseline is not False
        self.clip_low, self.clip_high = cfg.advantage_clip_low, cfg.advantage_clip_high

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        valid_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """[B, S] advantages (the sample's scalar broadcast over ``mask``'s shape)."""
        valid = torch.ones_like(rewards) if valid_mask is None else valid_mask
        baseline, std = calculate_baseline_and_std_per_prompt(
            prompt_ids, rewards, valid, leave_one_out_baseline=self.use_leave_one_out_baseline
        )
        advantages = rewards - baseline
        if self.normalize_rewards:
            nonzero = std > 0
            advantages = torch.where(
                nonzero, advantages / torch.where(nonzero, std, 1.0), advantages
            )
        advantages = _clip(advantages, self.clip_low, self.clip_high)
        return advantages.unsqueeze(-1) * torch.ones_like(mask, dtype=advantages.dtype)


class ReinforcePlusPlusAdvantageEstimator:
    """Reinforce++ (Hu 2025): token returns, then whitening over the whole batch.

        r_t = -beta KL_t [use_kl_in_reward]  +  (R - mean_group(R) [minus_baseline]) at the
              last valid token
        G_t = sum_{s >= t} r_s                      (gamma = 1)
        A_t = (G_t - mean(G)) / (std(G) + 1e-8)     over all valid tokens of the batch

    beta, the KL estimator and its clamps are the loss config's
    ``reference_policy_kl_penalty``/``reference_policy_kl_type``/``kl_*_clamp_value``.
    """

    def __init__(
        self,
        estimator_config: AdvEstimatorConfig | Mapping[str, Any],
        loss_config: ClippedPGLossConfig | Mapping[str, Any] | None = None,
    ):
        cfg = validate_section(AdvEstimatorConfig, estimator_config, "grpo.adv_estimator")
        self.minus_baseline = cfg.minus_baseline
        self.clip_low, self.clip_high = cfg.advantage_clip_low, cfg.advantage_clip_high
        self.loss_config = validate_section(ClippedPGLossConfig, loss_config or {}, "loss_fn")

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        logprobs_policy: torch.Tensor | None = None,
        logprobs_reference: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self.minus_baseline:
            baseline, _ = calculate_baseline_and_std_per_prompt(
                prompt_ids, rewards, torch.ones_like(rewards), leave_one_out_baseline=False
            )
            rewards = rewards - baseline
        mask = mask.to(rewards.dtype)
        token_rewards = _terminal_rewards(rewards, mask) + _kl_rewards(
            self.loss_config, mask, logprobs_policy, logprobs_reference
        )
        returns = token_rewards.flip(-1).cumsum(-1).flip(-1) * mask
        advantages = _whiten(returns, mask)
        return _clip(advantages, self.clip_low, self.clip_high) * mask


class GeneralizedAdvantageEstimator:
    """GAE (Schulman 2016) over each sequence's valid tokens, for PPO with a value model.

        r_t     = -beta KL_t [use_kl_in_reward]  +  R at the last valid token
        delta_t = r_t + gamma V_{t'} - V_t          (t' = next valid token; V = 0 past the end)
        A_t     = delta_t + gamma lambda A_{t'}     (``gae_gamma``, ``gae_lambda``)
        returns = A + V                             (the value model's target)

    ``normalize_advantages`` whitens A over the valid tokens of the batch (returns are not
    whitened); ``advantage_clip_low``/``_high`` clamp it. ``values`` [B, S] are aligned with
    input_ids: values[:, t] estimates the return of the state before token t.
    """

    def __init__(
        self,
        ppo_config: PPOAdvantageConfig | Mapping[str, Any],
        loss_config: ClippedPGLossConfig | Mapping[str, Any] | None = None,
    ):
        self.cfg = validate_section(PPOAdvantageConfig, ppo_config, "ppo")
        self.loss_config = validate_section(ClippedPGLossConfig, loss_config or {}, "loss_fn")

    def compute_advantages_and_returns(
        self,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        values: torch.Tensor,
        logprobs_policy: torch.Tensor | None = None,
        logprobs_reference: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)``, both [B, S] and zero outside ``mask``."""
        mask = mask.to(values.dtype)
        token_rewards = _terminal_rewards(rewards.to(values.dtype), mask) + _kl_rewards(
            self.loss_config, mask, logprobs_policy, logprobs_reference
        )
        gamma, lam = self.cfg.gae_gamma, self.cfg.gae_lambda
        advantages = torch.zeros_like(values)
        next_value = values.new_zeros(values.shape[0])
        next_advantage = values.new_zeros(values.shape[0])
        for t in reversed(range(values.shape[1])):
            valid = mask[:, t] > 0
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            advantage = delta + gamma * lam * next_advantage
            advantages[:, t] = torch.where(valid, advantage, 0.0)
            next_value = torch.where(valid, values[:, t], next_value)
            next_advantage = torch.where(valid, advantage, next_advantage)
        returns = (advantages + values) * mask
        if self.cfg.normalize_advantages:
            advantages = _whiten(advantages, mask)
        advantages = _clip(advantages, self.cfg.advantage_clip_low, self.cfg.advantage_clip_high)
        return advantages * mask, returns

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        values: torch.Tensor | None = None,
        logprobs_policy: torch.Tensor | None = None,
        logprobs_reference: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The estimator interface: advantages only (``values`` is required)."""
        if values is None:
            raise ValueError("GAE needs values= (the value model's [B, S] estimates)")
        advantages, _ = self.compute_advantages_and_returns(
            rewards, mask, values, logprobs_policy, logprobs_reference
        )
        return advantages


AdvantageEstimator = (
    GRPOAdvantageEstimator | ReinforcePlusPlusAdvantageEstimator | GeneralizedAdvantageEstimator
)


def create_advantage_estimator(
    estimator_config: AdvEstimatorConfig | Mapping[str, Any],
    loss_config: ClippedPGLossConfig | Mapping[str, Any] | None = None,
) -> GRPOAdvantageEstimator | ReinforcePlusPlusAdvantageEstimator:
    """The estimator named by ``grpo.adv_estimator.name`` ("grpo" or "reinforce_plus_plus")."""
    cfg = validate_section(AdvEstimatorConfig, estimator_config, "grpo.adv_estimator")
    if cfg.name == "reinforce_plus_plus":
        return ReinforcePlusPlusAdvantageEstimator(cfg, loss_config)
    return GRPOAdvantageEstimator(cfg, loss_config)


def _terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, S] zeros with each sample's reward on its last valid token."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=-1).values
    token_rewards = torch.zeros_like(mask)
    has_tokens = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has_tokens]
    token_rewards[rows, last[has_tokens]] = rewards[has_tokens].to(mask.dtype)
    return token_rewards


def _kl_rewards(
    loss_config: ClippedPGLossConfig,
    mask: torch.Tensor,
    logprobs_policy: torch.Tensor | None,
    logprobs_reference: torch.Tensor | None,
) -> torch.Tensor:
    """-beta * KL_t on valid tokens when ``use_kl_in_reward``, else zeros."""
    if not loss_config.use_kl_in_reward or loss_config.reference_policy_kl_penalty == 0:
        return torch.zeros_like(mask)
    if logprobs_policy is None or logprobs_reference is None:
        raise ValueError(
            "loss_fn.use_kl_in_reward needs logprobs_policy= and logprobs_reference= ([B, S])"
        )
    kl = calculate_kl(
        logprobs_policy.to(mask.dtype),
        logprobs_reference.to(mask.dtype),
        kl_type=loss_config.reference_policy_kl_type,
        input_clamp_value=loss_config.kl_input_clamp_value,
        output_clamp_value=loss_config.kl_output_clamp_value,
    )
    return -loss_config.reference_policy_kl_penalty * kl * mask


def _whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / (std + 1e-8) over the valid tokens of the whole batch."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean).square(), mask)
    return (values - mean) / (var.sqrt() + 1e-8) * mask


def _clip(values: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    if low is None and high is None:
        return values
    return values.clamp(min=low, max=high)
