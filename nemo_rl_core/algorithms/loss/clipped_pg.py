"""The policy-gradient loss of GRPO and PPO (and REINFORCE, RLOO, GSPO, CISPO by knobs)."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.config import ClippedPGLossConfig, clipped_pg_config_problems
from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.loss.utils import reduce_token_loss
from nemo_rl_core.algorithms.utils import calculate_kl, masked_mean
from nemo_rl_core.utils.config import filled


class ClippedPGLossFn:
    r"""Clipped policy-gradient loss with KL penalty (PPO / GRPO).

    Per response token t, with A_t = ``advantages``, pi = current policy
    (``next_token_logprobs``), pi_old = ``prev_logprobs``, pi_gen = ``generation_logprobs``,
    pi_ref = ``reference_policy_logprobs``:

        r_t        = pi(t) / pi_old(t)
        L_clip(t)  = max(-A_t r_t, -A_t clip(r_t, 1 - ratio_clip_min, 1 + ratio_clip_max))
        L_dual(t)  = min(L_clip(t), -A_t c)   where A_t < 0                (``ratio_clip_c``)
        L          = reduce(w_t L(t)) + beta reduce(KL_t) + mu NLL_correct

    Knobs, term by term:

    - ratio r_t: ``force_on_policy_ratio`` uses r_t = exp(log pi - sg(log pi)) = 1 with the
      on-policy gradient, unclipped, and never reads ``prev_logprobs``; ``disable_ppo_ratio``
      replaces r_t by log pi, unclipped (REINFORCE / RLOO); ``sequence_level_importance_ratios``
      (GSPO) uses the sequence's exp(mean_t log pi/pi_old) for every token; ``use_cispo``
      makes L(t) = -A_t sg(clip(r_t)) log pi (CISPO).
    - dual clip: ``ratio_clip_c`` (> 1, None = off).
    - w_t = 1 unless ``use_importance_sampling_correction``: then pi_old / pi_gen per token,
      or per sequence under GSPO exp(sum_t log pi_old/pi_gen), truncated by
      ``truncated_importance_sampling_type``: "tis" clamps to
      [``_ratio_min`` (default 0), ``_ratio``], "icepop" zeroes tokens outside it,
      "seq-mask-tis" zeroes sequences whose exp(mean_t log pi_old/pi_gen) is outside it.
    - KL: beta = ``reference_policy_kl_penalty`` (0 = off; moved into the reward by
      ``use_kl_in_reward``), estimator ``reference_policy_kl_type`` with
      ``kl_input_clamp_value`` / ``kl_output_clamp_value``, weighted by
      exp(log pi - sg(log pi)) (1 in value, carrying the score-function gradient of the
      sampling distribution) or, with ``use_on_policy_kl_approximation``, by pi / pi_gen.
    - reduce: ``token_level_loss`` true = sum over valid tokens / global_valid_toks; false =
      per-sequence token mean, summed over valid sequences / global_valid_seqs.
    - NLL on correct samples (VAPO): mu = ``positive_example_nll_weight``, over the tokens of
      samples whose ``rewards`` are positive, normalized by their own token count.

    Data (all [B, S] aligned with input_ids; position 0 is dropped): ``advantages``,
    ``prev_logprobs`` (not with ``force_on_policy_ratio``), ``generation_logprobs``,
    ``reference_policy_logprobs`` (only with the KL term), ``token_mask``; ``sample_mask``
    and (for the NLL term) ``rewards`` [B].
    """

    input_type = LossInputType.LOGPROB

    def __init__(self, cfg: ClippedPGLossConfig | Mapping[str, Any]):
        if not isinstance(cfg, ClippedPGLossConfig):
            cfg = ClippedPGLossConfig.model_validate(dict(cfg))
        problems = clipped_pg_config_problems(cfg)
        assert not problems, "; ".join(why for _, why in problems)
        self.cfg = cfg
        self.loss_type = LossType.TOKEN_LEVEL if cfg.token_level_loss else LossType.SEQUENCE_LEVEL
        self.reference_policy_kl_penalty = (
            0.0 if cfg.use_kl_in_reward else cfg.reference_policy_kl_penalty
        )

    @property
    def uses_kl_penalty(self) -> bool:
        """Whether the loss reads ``reference_policy_logprobs``."""
        return self.reference_policy_kl_penalty != 0

    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = self.cfg
        curr = next_token_logprobs
        token_mask = data["token_mask"][:, 1:]
        sample_mask = data["sample_mask"]
        mask = token_mask * sample_mask.unsqueeze(-1)
        advantages = data["advantages"][:, 1:]
        gen = data["generation_logprobs"][:, 1:]
        prev = curr.detach() if cfg.force_on_policy_ratio else data["prev_logprobs"][:, 1:]

        def token_mean(values: torch.Tensor) -> torch.Tensor:
            return masked_mean(values, mask, global_normalization_factor=global_valid_toks)

        def reduce(per_token: torch.Tensor) -> torch.Tensor:
            return reduce_token_loss(
                per_token,
                token_mask,
                sample_mask,
                self.loss_type,
                global_valid_seqs,
                global_valid_toks,
            )

        kl = self._kl_penalty(curr, gen, data, reduce)
        ratios, ratios_clamped = self._ratios(curr, prev, token_mask, advantages.shape[1])
        if cfg.use_cispo:
            clip_loss = -advantages * ratios_clamped.detach() * curr
        else:
            clip_loss = torch.max(-advantages * ratios, -advantages * ratios_clamped)
        if cfg.ratio_clip_c is not None:
            assert cfg.ratio_clip_c > 1, f"ratio_clip_c must exceed 1, got {cfg.ratio_clip_c}"
            dual = -advantages * cfg.ratio_clip_c
            clip_loss = torch.where(advantages < 0, torch.min(clip_loss, dual), clip_loss)

        is_weights, is_metrics = self._importance_weights(
            prev, gen, token_mask, sample_mask, mask, global_valid_seqs, global_valid_toks
        )
        weights = is_weights if cfg.use_importance_sampling_correction else torch.ones_like(prev)
        actor_loss = reduce(weights * clip_loss)

        nll = curr.new_zeros(())
        if cfg.positive_example_nll_weight > 0 and "rewards" in data:
            correct = mask * (data["rewards"] > 0).to(mask.dtype).unsqueeze(-1)
            if correct.sum() > 0:
                nll = masked_mean(-curr, correct)
        loss = actor_loss + kl + cfg.positive_example_nll_weight * nll

        with torch.no_grad():
            valid = mask.bool()
            kept_ratios, kept_clamped = ratios.detach()[valid], ratios_clamped.detach()[valid]
            empty = kept_ratios.numel() == 0
            if cfg.sequence_level_importance_ratios:
                sample_ratio = masked_mean(
                    is_weights.squeeze(-1), sample_mask, None, global_valid_seqs
                )
            else:
                sample_ratio = token_mean(is_weights)
            metrics = {
                "loss": loss.item(),
                "probs_ratio": token_mean(ratios.detach()).item(),
                "probs_ratio_clamped": token_mean(ratios_clamped.detach()).item(),
                # Not in NeMo RL: the share of tokens whose ratio left the clip range.
                "probs_ratio_clamped_fraction": token_mean(
                    (ratios.detach() != ratios_clamped.detach()).float()
                ).item(),
                "probs_ratio_min": float("inf") if empty else kept_ratios.min().item(),
                "probs_ratio_max": float("-inf") if empty else kept_ratios.max().item(),
                "probs_ratio_clamped_min": float("inf") if empty else kept_clamped.min().item(),
                "probs_ratio_clamped_max": float("-inf") if empty else kept_clamped.max().item(),
                "kl_penalty": kl.item() / self.reference_policy_kl_penalty if kl else 0,
                **self._mismatch_metrics(prev, gen, mask, cfg.reference_policy_kl_type, token_mean),
                "sampling_importance_ratio": sample_ratio.item(),
                "num_valid_samples": sample_mask.sum().item(),
                # E_{pi_gen}[-(pi / pi_gen) log pi]: entropy of pi from samples of pi_gen
                "approx_entropy": -token_mean((curr - gen).exp() * curr).item(),
                **is_metrics,
                "positive_nll_loss": nll.item(),
            }
        return loss, metrics

    def _kl_penalty(
        self, curr: torch.Tensor, gen: torch.Tensor, data: Mapping[str, Any], reduce: Any
    ) -> torch.Tensor:
        """beta * reduce(w_t KL_t(pi || pi_ref)), 0 when the penalty is off."""
        if not self.uses_kl_penalty:
            return torch.tensor(0.0)
        cfg = self.cfg
        reference = data["reference_policy_logprobs"][:, 1:]
        curr = data.get("curr_logprobs_unfiltered", curr)
        sampled_from = gen if cfg.use_on_policy_kl_approximation else curr.detach()
        weights = torch.nan_to_num((curr - sampled_from).exp(), nan=0.0, posinf=0.0, neginf=0.0)
        per_token = calculate_kl(
            curr,
            reference,
            kl_type=cfg.reference_policy_kl_type,
            input_clamp_value=cfg.kl_input_clamp_value,
            output_clamp_value=cfg.kl_output_clamp_value,
            importance_sampling_weights=weights,
        )
        return reduce(self.reference_policy_kl_penalty * per_token)

    def _ratios(
        self, curr: torch.Tensor, prev: torch.Tensor, token_mask: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(r_t, clip(r_t)) per the ratio knobs."""
        cfg = self.cfg
        if cfg.force_on_policy_ratio:
            ratios = (curr - curr.detach()).exp()
            return ratios, ratios
        if cfg.disable_ppo_ratio:
            return curr, curr
        log_ratios = curr - prev
        if cfg.sequence_level_importance_ratios:
            sequence = masked_mean(log_ratios, token_mask, dim=-1).unsqueeze(-1).exp()
            ratios = sequence.repeat(1, length)
        else:
            ratios = log_ratios.exp()
        return ratios, ratios.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)

    def _importance_weights(
        self,
        prev: torch.Tensor,
        gen: torch.Tensor,
        token_mask: torch.Tensor,
        sample_mask: torch.Tensor,
        mask: torch.Tensor,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """pi_old / pi_gen (per token, or per sequence under GSPO), truncated; with
        ``is_oob_ratio``: the fraction of tokens (sequences for seq-mask-tis) outside the
        truncation bounds, as a share of the global count."""
        cfg = self.cfg
        if cfg.sequence_level_importance_ratios:
            summed = ((prev - gen) * mask).sum(dim=-1)
            weights = _finite(summed.exp().detach()).unsqueeze(-1)
        else:
            weights = _finite((prev - gen).exp())
        high, low = (
            cfg.truncated_importance_sampling_ratio,
            cfg.truncated_importance_sampling_ratio_min,
        )
        if high is None:
            return weights, {}
        kind = cfg.truncated_importance_sampling_type
        if kind == "seq-mask-tis":
            log_ratio = torch.nan_to_num(prev - gen, nan=0.0, posinf=0.0, neginf=0.0)
            geo_mean = masked_mean(log_ratio, token_mask, dim=-1).exp().detach()
            low = filled(low, "loss_fn.truncated_importance_sampling_ratio_min")
            kept = ((geo_mean >= low) & (geo_mean <= high)).to(weights.dtype)
            oob = masked_mean(1.0 - kept, sample_mask, None, global_valid_seqs)
            return weights * kept.unsqueeze(-1), {"is_oob_ratio": oob.item()}
        if kind not in ("tis", "icepop"):
            raise ValueError(f"Invalid truncated importance sampling type: {kind}")
        low = 0.0 if low is None else low
        outside = (weights > high) | (weights < low)
        oob = masked_mean(outside.float(), mask, None, global_valid_toks)
        if kind == "tis":
            weights = weights.clamp(min=low, max=high)
        else:  # icepop
            weights = torch.where(outside, torch.zeros_like(weights), weights)
        return weights, {"is_oob_ratio": oob.item()}

    @staticmethod
    def _mismatch_metrics(
        prev: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor, kl_type: Any, token_mean: Any
    ) -> dict[str, float]:
        """How far the trainer's logprobs of the samples are from the generator's: NeMo RL's
        token_mult_prob_error, KL both ways (the loss's estimator) and the Jensen-Shannon
        divergence."""
        mixture = torch.log(0.5 * prev.exp() + 0.5 * gen.exp())

        def k3(logp: torch.Tensor) -> torch.Tensor:
            return (logp - mixture).exp() - (logp - mixture) - 1

        return {
            "token_mult_prob_error": token_mean(((gen - prev).abs() * mask).exp()).item(),
            "gen_kl_error": token_mean(calculate_kl(gen, prev, kl_type, None, None)).item(),
            "policy_kl_error": token_mean(calculate_kl(prev, gen, kl_type, None, None)).item(),
            "js_divergence_error": token_mean(0.5 * k3(prev) + 0.5 * k3(gen)).item(),
        }


def _finite(values: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
