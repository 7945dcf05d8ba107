"""Pairwise preference losses: reward-model training and DPO.

Batches interleave pairs: sample 2i is the chosen response, 2i+1 the rejected one for
the same prompt, so a microbatch holds whole pairs. Normalizing by global_valid_seqs / 2
(the global number of pairs) keeps the microbatch shares additive.
"""

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from nemo_rl_core.algorithms.config import DPOLossConfig
from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.loss.nll import NLLLossFn
from nemo_rl_core.algorithms.utils import masked_mean


class PreferenceLossFn:
    r"""Reward-model (Bradley-Terry) loss on a scalar-head model.

        loss = sum_pairs m_c -log sigmoid(beta (r_c - r_r)) / (global_valid_seqs / 2)

    r = ``logits`` ([B] or [B, 1], the model's score per sequence), m_c the chosen
    sample's ``sample_mask``; beta = 1 here (DPO sets it).
    """

    loss_type = LossType.SEQUENCE_LEVEL
    input_type = LossInputType.LOGIT

    @staticmethod
    def split_output_tensor(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, rejected)`` = every even and every odd sample."""
        return tensor[::2], tensor[1::2]

    def _preference_loss(
        self,
        rewards: torch.Tensor,
        sample_mask: torch.Tensor,
        global_valid_seqs: torch.Tensor,
        beta: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, accuracy, mean chosen reward, mean rejected reward) over this microbatch's
        pairs, each a share of the global pair count."""
        chosen, rejected = self.split_output_tensor(rewards)
        chosen_mask, rejected_mask = self.split_output_tensor(sample_mask)
        pairs = global_valid_seqs / 2
        per_pair = -F.logsigmoid(beta * (chosen - rejected)) * chosen_mask
        return (
            masked_mean(per_pair, chosen_mask, global_normalization_factor=pairs),
            masked_mean(chosen > rejected, chosen_mask, global_normalization_factor=pairs),
            masked_mean(chosen, chosen_mask, global_normalization_factor=pairs),
            masked_mean(rejected, rejected_mask, global_normalization_factor=pairs),
        )

    def __call__(
        self,
        logits: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        sample_mask = data["sample_mask"]
        loss, accuracy, chosen, rejected = self._preference_loss(
            logits.squeeze(-1), sample_mask, global_valid_seqs
        )
        return loss, {
            "loss": loss.item(),
            "accuracy": accuracy.item(),
            "rewards_chosen_mean": chosen.item(),
            "rewards_rejected_mean": rejected.item(),
            "num_valid_samples": (sample_mask.sum() / 2).item(),
        }


class DPOLossFn(PreferenceLossFn):
    r"""Direct Preference Optimization (Rafailov 2023) with an optional SFT term.

        rho(y)  = sum_t m_t (log pi(y_t) - log pi_ref(y_t))     [/ sum_t m_t if
                  ``preference_average_log_probs``]
        L_pref  = sum_pairs -log sigmoid(beta (rho(y_c) - rho(y_r))) / (global_valid_seqs / 2)
        L_sft   = sum_pairs -sum_t m_t log pi(y_c,t)  [/ sum_t m_t if ``sft_average_log_probs``]
                  / (global_valid_seqs / 2)
        loss    = ``preference_loss_weight`` L_pref + ``sft_loss_weight`` L_sft

    beta = ``reference_policy_kl_penalty`` (0 allowed). Data: ``reference_policy_logprobs``
    [B, S] holding at position t the reference's log-prob of token t+1 (as NeMo RL's DPO
    stores it, shifted), ``token_mask`` [B, S], ``sample_mask`` [B], pairs interleaved.
    """

    loss_type = LossType.SEQUENCE_LEVEL
    input_type = LossInputType.LOGPROB

    def __init__(self, cfg: DPOLossConfig | Mapping[str, Any]):
        if not isinstance(cfg, DPOLossConfig):
            known = {k: v for k, v in dict(cfg).items() if k in DPOLossConfig.model_fields}
            cfg = DPOLossConfig.model_validate(known)
        self.cfg = cfg
        self.reference_policy_kl_penalty = cfg.reference_policy_kl_penalty
        self.preference_loss_weight = cfg.preference_loss_weight
        self.sft_loss_weight = cfg.sft_loss_weight
        self.preference_average_log_probs = cfg.preference_average_log_probs
        self.sft_average_log_probs = cfg.sft_average_log_probs
        self.sft_loss = NLLLossFn()

    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        sample_mask = data["sample_mask"]
        sft_loss = torch.tensor(0.0)
        if self.sft_loss_weight > 0:
            assert global_valid_toks is not None, "global_valid_toks must be provided for SFT loss"
            per_sequence, _ = self.sft_loss(
                next_token_logprobs,
                data,
                global_valid_seqs=global_valid_seqs,
                global_valid_toks=global_valid_toks,
                dpo_loss=True,
                dpo_average_log_probs=self.sft_average_log_probs,
            )
            chosen, _ = self.split_output_tensor(per_sequence)
            sft_loss = masked_mean(
                chosen, sample_mask[::2], global_normalization_factor=global_valid_seqs / 2
            )
        token_mask = data["token_mask"][:, 1:]
        log_ratio = (next_token_logprobs - data["reference_policy_logprobs"][:, :-1]) * token_mask
        rewards = log_ratio.sum(-1)
        if self.preference_average_log_probs:
            rewards = rewards / token_mask.sum(-1).clamp(min=1)
        preference_loss, accuracy, chosen, rejected = self._preference_loss(
            rewards, sample_mask, global_valid_seqs, self.reference_policy_kl_penalty
        )
        loss = self.sft_loss_weight * sft_loss + self.preference_loss_weight * preference_loss
        return loss, {
            "loss": loss.item(),
            "sft_loss": sft_loss.item(),
            "preference_loss": preference_loss.item(),
            "accuracy": accuracy.item(),
            "rewards_chosen_mean": chosen.item(),
            "rewards_rejected_mean": rejected.item(),
            "num_valid_samples": (sample_mask.sum() / 2).item(),
        }
