"""Advantage estimators (``nemo_rl.algorithms.advantage_estimator``): GRPO, GDPO,
Reinforce++, GAE and raw rewards.

Each estimator maps per-sample rewards (and, where needed, per-token values or log-probs)
to per-token advantages [B, S] over ``mask``'s shape, ready to be stored as
``advantages`` for :class:`~nemo_rl_core.algorithms.loss.ClippedPGLossFn`. GAE and the raw
estimator return ``(advantages, returns)``, as NeMo RL's do.
"""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.config import ClippedPGLossConfig
from nemo_rl_core.algorithms.utils import (
    calculate_baseline_and_std_per_prompt,
    calculate_kl,
    get_gdpo_reward_component_keys,
    masked_mean,
    masked_var,
)


def _settings(config: Any) -> Mapping[str, Any]:
    """An estimator config as a mapping (a YAML dict or its validated model)."""
    return config if isinstance(config, Mapping) else config.model_dump()


def _loss_settings(config: ClippedPGLossConfig | Mapping[str, Any] | None) -> ClippedPGLossConfig:
    if isinstance(config, ClippedPGLossConfig):
        return config
    return ClippedPGLossConfig.model_validate(dict(config or {}))


class GRPOAdvantageEstimator:
    """A_i = (R_i - baseline_i) [/ (std_i + 1e-6)], the same value on every token of sample i.

    baseline/std come from the samples of the same prompt
    (:func:`calculate_baseline_and_std_per_prompt`, leave-one-out by
    ``use_leave_one_out_baseline``). Division by std only with ``normalize_rewards`` and
    only where std > 0: a group of equal rewards keeps A = 0.
    """

    def __init__(self, estimator_config: Any, loss_config: Any = None):
        settings = _settings(estimator_config)
        self.use_leave_one_out_baseline = settings["use_leave_one_out_baseline"]
        self.normalize_rewards = settings["normalize_rewards"]

    def compute_advantage(
        self, prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        baseline, std = calculate_baseline_and_std_per_prompt(
            prompt_ids,
            rewards,
            torch.ones_like(rewards),
            leave_one_out_baseline=self.use_leave_one_out_baseline,
        )
        advantages = rewards - baseline
        if self.normalize_rewards:
            varied = std > 0
            advantages = torch.where(varied, advantages / (std + 1e-6), advantages)
        return advantages.unsqueeze(-1).expand(mask.shape)


class GDPOAdvantageEstimator:
    """GDPO: GRPO's per-prompt advantage of each reward component on its own (``reward1``,
    ``reward2``, ... of a multi-reward environment), so that a component with a small spread
    is not drowned by one with a large spread; their sum is then standardised over the batch
    (zero mean, unit std; only centred where every sample has the same sum)."""

    def __init__(self, estimator_config: Any, loss_config: Any = None):
        self.per_component = GRPOAdvantageEstimator(estimator_config, loss_config)

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor | None,
        mask: torch.Tensor,
        repeated_batch: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        repeated_batch = repeated_batch or {}
        keys = get_gdpo_reward_component_keys(repeated_batch)
        if len(keys) < 2:
            raise ValueError(
                f"GDPO needs several reward components (reward1, reward2, ...), and this "
                f"batch has {len(keys)}: score with a multi-reward environment "
                "(env.math_multi_reward), or set grpo.adv_estimator.name to grpo"
            )
        one_token = mask[:, :1]  # the per-sample advantage, before it spreads over tokens
        total = sum(
            self.per_component.compute_advantage(
                prompt_ids, torch.as_tensor(repeated_batch[key], dtype=torch.float32), one_token
            )
            for key in keys
        )
        assert isinstance(total, torch.Tensor)
        centred = total - total.mean()
        spread = total.std()
        return (centred / spread if spread > 0 else centred).expand(mask.shape)


class ReinforcePlusPlusAdvantageEstimator:
    """Reinforce++ (Hu 2025), as NeMo RL computes it:

        A_t = R - mean_group(R) [``minus_baseline``]  -  beta KL_t [``use_kl_in_reward``]
        A   = (A - mean(A)) / sqrt(max(var(A), 1e-8))    over the valid tokens of the batch

    beta and the estimator are the loss config's ``reference_policy_kl_penalty`` and
    ``reference_policy_kl_type``.
    """

    def __init__(self, estimator_config: Any, loss_config: Any = None):
        self.minus_baseline = _settings(estimator_config)["minus_baseline"]
        loss = _loss_settings(loss_config)
        self.use_kl_in_reward = loss.use_kl_in_reward
        self.kl_coef = loss.reference_policy_kl_penalty
        self.kl_type = loss.reference_policy_kl_type

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
            mean, _ = calculate_baseline_and_std_per_prompt(
                prompt_ids, rewards, torch.ones_like(rewards), leave_one_out_baseline=False
            )
            rewards = rewards - mean
        advantages = rewards.unsqueeze(-1).expand(mask.shape)
        if self.use_kl_in_reward and logprobs_policy is not None and logprobs_reference is not None:
            kl = calculate_kl(logprobs_policy, logprobs_reference, kl_type=self.kl_type)
            advantages = advantages - self.kl_coef * kl
        return _whiten_global(advantages, mask)


class RawRewardAdvantageEstimator:
    """The reward itself on every token (no value model, no baseline), whitened over the
    batch's valid tokens with ``normalize_advantages``. Returns ``(advantages, None)``."""

    def __init__(self, estimator_config: Any, loss_config: Any = None):
        self.normalize_advantages = _settings(estimator_config)["normalize_advantages"]

    def compute_advantage(
        self, prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> tuple[torch.Tensor, None]:
        advantages = rewards.unsqueeze(-1).expand(mask.shape)
        if self.normalize_advantages:
            advantages = _whiten_global(advantages, mask)
        return advantages, None


class GeneralizedAdvantageEstimator:
    r"""GAE (Schulman 2016) for PPO with a value model.

        r_t     = -beta KL_t [``use_kl_in_reward``]  +  R at the last valid token,  0 elsewhere
        delta_t = r_t + gamma V_{t'} - V_t       (t' = next valid token; V = 0 past the end)
        A_t     = delta_t + gamma lambda A_{t'}  (``gae_gamma``, ``gae_lambda``)
        returns = A + V                          (the value model's targets)

    At masked positions the running V and A carry over from the next valid token, so a gap
    (padding, an environment turn) adds no TD error. VAPO's decoupling: ``gae_lambda_value``
    for the returns and ``gae_lambda_policy`` (or, with ``length_adaptive_alpha`` = a > 0,
    1 - 1 / (a * response length) per sample) for the advantages, each defaulting to
    ``gae_lambda``. ``normalize_advantages`` whitens A over the batch's valid tokens
    (unbiased variance); A is zero outside ``mask``.
    """

    def __init__(self, estimator_config: Any, loss_config: Any = None):
        settings = _settings(estimator_config)
        self.gae_lambda = settings["gae_lambda"]
        self.gae_gamma = settings["gae_gamma"]
        self.normalize_advantages = settings["normalize_advantages"]
        self.gae_lambda_value = settings["gae_lambda_value"]
        self.gae_lambda_policy = settings["gae_lambda_policy"]
        self.length_adaptive_alpha = settings["length_adaptive_alpha"]
        loss = _loss_settings(loss_config)
        self.use_kl_in_reward = loss.use_kl_in_reward
        self.kl_coef = loss.reference_policy_kl_penalty
        self.kl_type = loss.reference_policy_kl_type

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        values: torch.Tensor,
        reference_logprobs: torch.Tensor | None = None,
        logprobs: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)``, both [B, S]."""
        token_rewards = self._token_rewards(rewards, mask, logprobs, reference_logprobs)
        decoupled = (
            self.gae_lambda_value is not None
            or self.gae_lambda_policy is not None
            or self.length_adaptive_alpha > 0
        )
        if decoupled:
            _, returns = self._gae(token_rewards, values, mask, self._resolve_lambda_value())
            advantages, _ = self._gae(
                token_rewards, values, mask, self._resolve_lambda_policy(mask)
            )
        else:
            advantages, returns = self._gae(token_rewards, values, mask, self.gae_lambda)
        if self.normalize_advantages:
            mean = masked_mean(advantages, mask)
            advantages = (advantages - mean) * torch.rsqrt(
                masked_var(advantages, mask, mean) + 1e-8
            )
        return advantages.masked_fill(~mask.bool(), 0), returns

    def _token_rewards(
        self,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        logprobs: torch.Tensor | None,
        reference_logprobs: torch.Tensor | None,
    ) -> torch.Tensor:
        token_rewards = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
        kl_on = self.use_kl_in_reward and self.kl_coef > 0
        if kl_on and logprobs is not None and reference_logprobs is not None:
            token_rewards = token_rewards - self.kl_coef * calculate_kl(
                logprobs, reference_logprobs, self.kl_type
            )
        last = mask.shape[1] - 1 - mask.fliplr().argmax(dim=1)
        has_tokens = mask.bool().any(dim=1)
        token_rewards[has_tokens, last[has_tokens]] += rewards[has_tokens]
        return token_rewards * mask

    def _resolve_lambda_policy(self, mask: torch.Tensor) -> float | torch.Tensor:
        """The advantages' lambda: length-adaptive, else ``gae_lambda_policy``, else
        ``gae_lambda``."""
        if self.length_adaptive_alpha > 0:
            lengths = mask.sum(dim=1).float()
            lam = 1.0 - 1.0 / (self.length_adaptive_alpha * lengths).clamp(min=1.0)
            return lam.clamp(min=0.0, max=1.0)
        return self.gae_lambda if self.gae_lambda_policy is None else self.gae_lambda_policy

    def _resolve_lambda_value(self) -> float:
        return self.gae_lambda if self.gae_lambda_value is None else self.gae_lambda_value

    def _gae(
        self,
        token_rewards: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        lam: float | torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        gamma = self.gae_gamma
        next_value = values.new_zeros(values.shape[0])
        running = torch.zeros_like(next_value)
        columns = []
        for t in reversed(range(token_rewards.shape[1])):
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            advantage = delta + gamma * lam * running
            keep = mask[:, t]
            next_value = keep * values[:, t] + (1 - keep) * next_value
            running = keep * advantage + (1 - keep) * running
            columns.append(running)
        advantages = torch.stack(columns[::-1], dim=1)
        return advantages, advantages + values


AdvantageEstimator = (
    GRPOAdvantageEstimator
    | GDPOAdvantageEstimator
    | ReinforcePlusPlusAdvantageEstimator
    | GeneralizedAdvantageEstimator
    | RawRewardAdvantageEstimator
)
_ESTIMATORS: dict[str, type] = {
    "grpo": GRPOAdvantageEstimator,
    "gdpo": GDPOAdvantageEstimator,
    "reinforce_plus_plus": ReinforcePlusPlusAdvantageEstimator,
    "gae": GeneralizedAdvantageEstimator,
    "raw_reward": RawRewardAdvantageEstimator,
}


def create_advantage_estimator(
    estimator_config: Any, loss_config: Any = None
) -> AdvantageEstimator:
    """The estimator ``estimator_config["name"]`` names (``adv_estimator.name``)."""
    name = _settings(estimator_config)["name"]
    if name not in _ESTIMATORS:
        raise ValueError(f"adv_estimator.name {name!r} is not one of {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[name](estimator_config, loss_config)


def _whiten_global(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(max(var, 1e-8)) over the batch's valid tokens (biased variance)."""
    count = mask.sum()
    mean = (advantages * mask).sum() / count
    variance = ((advantages - mean).pow(2) * mask).sum() / count
    return (advantages - mean) * variance.clamp(min=1e-8).rsqrt()
