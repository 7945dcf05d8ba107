"""The policy-gradient loss of GRPO and PPO (and REINFORCE, RLOO, GSPO, CISPO by knobs)."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.config import ClippedPGLossConfig, validate_section
from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.loss.utils import check_aligned, reduce_token_loss
from nemo_rl_core.algorithms.utils import calculate_kl, masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class ClippedPGLossFn:
    r"""Clipped policy-gradient loss with KL penalty (PPO / GRPO).

    Per token t of a response, with A_t = ``advantages``, pi = current policy
    (``next_token_logprobs``), pi_old = ``prev_logprobs``, pi_gen = ``generation_logprobs``:

        r_t        = pi(t) / pi_old(t)                                 (PPO ratio)
        L_clip(t)  = max(-A_t r_t, -A_t clip(r_t, 1 - ratio_clip_min, 1 + ratio_clip_max))
        L_dual(t)  = min(L_clip(t), -A_t c)  where A_t < 0               (``ratio_clip_c`` = c)
        L_tok(t)   = w_t L(t) + beta * k_t KL_t(pi || pi_ref)

        loss = reduce(L_tok) [+ nll_w * mean_{A_t > 0} -log pi(t)]

    Knobs, term by term:

    - ratio r_t: ``force_on_policy_ratio`` takes pi_old = sg(pi), so r_t = exp(log pi -
      sg(log pi)) = 1 with the on-policy gradient, unclipped, and ``prev_logprobs`` is not
      read (NeMo RL: one optimizer step per batch, where pi_old = pi; GRPO then skips the
      forward that computes them); ``disable_ppo_ratio`` replaces r_t by log pi with no clipping
      (REINFORCE / RLOO); ``sequence_level_importance_ratios`` (GSPO) uses the
      sequence's geometric mean exp(mean_t log pi/pi_old) for every token;
      ``use_cispo`` makes L(t) = -A_t sg(clip(r_t)) log pi (CISPO: clipped, detached weight).
    - dual clip: ``ratio_clip_c`` (> 1, None = off).
    - w_t: 1 unless ``use_importance_sampling_correction``; then pi_old / pi_gen (the
      sequence geometric mean under GSPO), truncated by
      ``truncated_importance_sampling_type``: "tis" caps at
      ``truncated_importance_sampling_ratio``; "icepop" zeroes tokens outside
      [``_ratio_min``, ``_ratio``]; "seq-mask-tis" zeroes whole sequences whose geometric
      mean ratio is outside that range.
    - KL term: beta = ``reference_policy_kl_penalty`` (0 = off; off as well with
      ``use_kl_in_reward``, which moves it into the reward), estimator
      ``reference_policy_kl_type`` k1/k2/k3 with ``kl_input_clamp_value`` /
      ``kl_output_clamp_value``; k_t = pi / pi_gen (detached) when
      ``use_on_policy_kl_approximation``, else 1.
    - reduce: ``token_level_loss`` true = sum over valid tokens / global_valid_toks, false =
      per-sequence token mean summed over valid sequences / global_valid_seqs.
    - NLL on positive examples: ``positive_example_nll_weight`` (0 = off), tokens with
      A_t > 0, normalized by global_valid_toks.

    Data (all [B, S] aligned with input_ids; position 0 is dropped): ``advantages``,
    ``prev_logprobs`` (not with ``force_on_policy_ratio``), ``generation_logprobs``, ``reference_policy_logprobs`` (only with
    the KL term), ``token_mask``; ``sample_mask`` [B].
    """

    input_type = LossInputType.LOGPROB

    def __init__(self, cfg: ClippedPGLossConfig | Mapping[str, Any]):
        self.cfg = validate_section(ClippedPGLossConfig, cfg, "loss_fn")
        self.loss_type = (
            LossType.TOKEN_LEVEL if self.cfg.token_level_loss else LossType.SEQUENCE_LEVEL
        )

    @property
    def uses_kl_penalty(self) -> bool:
        """Whether the loss reads ``reference_policy_logprobs``."""
        return self.cfg.reference_policy_kl_penalty != 0 and not self.cfg.use_kl_in_reward

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        next_token_logprobs: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = self.cfg
        curr = next_token_logprobs
        token_mask = data["token_mask"][:, 1:].to(curr.dtype)
        sample_mask = data["sample_mask"].to(curr.dtype)
        check_aligned("next_token_logprobs", curr, token_mask)
        advantages = data["advantages"][:, 1:].to(curr.dtype)
        prev = (
            curr.detach()
            if cfg.force_on_policy_ratio
            else data["prev_logprobs"][:, 1:].to(curr.dtype)
        )
        gen = data["generation_logprobs"][:, 1:].to(curr.dtype)
        mask = token_mask * sample_mask.unsqueeze(-1)

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

        def seq_geo_mean(log_ratio: torch.Tensor) -> torch.Tensor:
            return (
                masked_mean(log_ratio, token_mask, dim=-1).exp().unsqueeze(-1).expand_as(log_ratio)
            )

        # --- KL(pi || pi_ref) penalty
        if self.uses_kl_penalty:
            ref = data["reference_policy_logprobs"][:, 1:].to(curr.dtype)
            kl_per_token = calculate_kl(
                curr,
                ref,
                kl_type=cfg.reference_policy_kl_type,
                input_clamp_value=cfg.kl_input_clamp_value,
                output_clamp_value=cfg.kl_output_clamp_value,
            )
            if cfg.use_on_policy_kl_approximation:
                kl_weights = torch.nan_to_num(
                    (curr - gen).detach().exp(), nan=0.0, posinf=0.0, neginf=0.0
                )
                kl_per_token = kl_weights * kl_per_token
            kl = reduce(kl_per_token)
        else:
            kl = curr.new_zeros(())

        # --- ratio and clipped surrogate
        log_ratio = curr - prev
        if cfg.force_on_policy_ratio:
            ratios = log_ratio.exp()  # = 1, d/dtheta = d log pi / dtheta
            ratios_clamped = ratios
        elif cfg.disable_ppo_ratio:
            ratios = curr
            ratios_clamped = curr
        else:
            ratios = (
                seq_geo_mean(log_ratio) if cfg.sequence_level_importance_ratios else log_ratio.exp()
            )
            ratios_clamped = ratios.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
        if cfg.use_cispo:
            clip_loss = -advantages * ratios_clamped.detach() * curr
            clipped = (ratios != ratios_clamped).to(curr.dtype)
        else:
            loss_unclipped = -advantages * ratios
            loss_clipped = -advantages * ratios_clamped
            clip_loss = torch.maximum(loss_unclipped, loss_clipped)
            clipped = (loss_clipped > loss_unclipped).to(curr.dtype)
        dual_clipped = torch.zeros_like(clipped)
        if cfg.ratio_clip_c is not None:
            loss_dual = -advantages * cfg.ratio_clip_c
            use_dual = (advantages < 0) & (loss_dual < clip_loss)
            clip_loss = torch.where(use_dual, loss_dual, clip_loss)
            dual_clipped = use_dual.to(curr.dtype)

        # --- importance weights pi_old / pi_gen for off-policy (generation-engine) samples
        is_log_ratio = prev - gen
        is_weights = (
            seq_geo_mean(is_log_ratio)
            if cfg.sequence_level_importance_ratios
            else is_log_ratio.exp()
        )
        is_weights = torch.nan_to_num(is_weights, nan=0.0, posinf=0.0, neginf=0.0)
        is_weights = self._truncate_importance_weights(is_weights, seq_geo_mean(is_log_ratio))
        weights = (
            is_weights if cfg.use_importance_sampling_correction else torch.ones_like(is_weights)
        )

        actor_loss = reduce(weights * clip_loss)
        loss = actor_loss + cfg.reference_policy_kl_penalty * kl  # kl = 0 when off

        metrics: dict[str, Any] = {}
        if cfg.positive_example_nll_weight > 0:
            positive_mask = mask * (advantages > 0).to(curr.dtype)
            nll = masked_mean(-curr, positive_mask, global_normalization_factor=global_valid_toks)
            loss = loss + cfg.positive_example_nll_weight * nll
            metrics["positive_example_nll"] = nll.item()

        with torch.no_grad():
            probs_ratio = log_ratio.exp()
            metrics.update(
                {
                    "loss": loss.item(),
                    "actor_loss": actor_loss.item(),
                    "kl_penalty": kl.item(),
                    "probs_ratio": token_mean(probs_ratio).item(),
                    "probs_ratio_clamped": token_mean(
                        probs_ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
                    ).item(),
                    "clipped_fraction": token_mean(clipped).item(),
                    "dual_clipped_fraction": token_mean(dual_clipped).item(),
                    # E_{pi_gen}[-(pi / pi_gen) log pi]: entropy of pi from samples of pi_gen
                    "approx_entropy": token_mean(-(curr - gen).exp() * curr).item(),
                    "token_mult_prob_error": token_mean((gen - prev).abs().exp()).item(),
                    "sampling_importance_ratio": token_mean(is_weights).item(),
                    "num_valid_samples": sample_mask.sum().item(),
                }
            )
        return loss, metrics

    def _truncate_importance_weights(
        self, weights: torch.Tensor, seq_weights: torch.Tensor
    ) -> torch.Tensor:
        """Truncated importance sampling: cap (tis) or mask (icepop, seq-mask-tis)."""
        cfg = self.cfg
        high = cfg.truncated_importance_sampling_ratio
        if high is None:
            return weights
        low = cfg.truncated_importance_sampling_ratio_min
        kind = cfg.truncated_importance_sampling_type
        if kind == "tis":
            return weights.clamp(max=high)
        source = seq_weights if kind == "seq-mask-tis" else weights
        keep = (source >= low) & (source <= high)
        return weights * keep.to(weights.dtype)
