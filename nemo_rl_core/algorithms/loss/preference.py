"""Pairwise preference losses: reward-model training and DPO.

Batches interleave pairs: sample 2i is the chosen response, 2i+1 the rejected one for
the same prompt, so a microbatch must hold whole pairs (an even number of samples).
Normalizing by global_valid_seqs / 2 (the global number of pairs) keeps the microbatch
shares additive.
"""

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from nemo_rl_core.algorithms.config import DPOLossConfig, validate_section
from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.loss.utils import check_aligned
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def split_pairs(values: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) = (values[0::2], values[1::2]); fails on an odd batch."""
    if values.shape[0] % 2:
        raise ValueError(
            f"{name} has {values.shape[0]} samples; preference batches interleave "
            "chosen/rejected pairs, so microbatch sizes must be even"
        )
    return values[0::2], values[1::2]


def preference_loss(
    rewards: torch.Tensor,
    sample_mask: torch.Tensor,
    global_valid_seqs: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry loss -log sigmoid(r_chosen - r_rejected), summed over valid pairs /
    (global_valid_seqs / 2), with the accuracy and mean rewards NeMo RL users watch."""
    chosen, rejected = split_pairs(rewards, "rewards")
    mask_chosen, mask_rejected = split_pairs(sample_mask, "sample_mask")
    pair_mask = mask_chosen * mask_rejected
    num_pairs = global_valid_seqs / 2
    loss = masked_mean(
        -F.logsigmoid(chosen - rejected), pair_mask, global_normalization_factor=num_pairs
    )
    with torch.no_grad():
        metrics = {
            "preference_loss": loss.item(),
            "accuracy": masked_mean(
                (chosen > rejected).to(rewards.dtype), pair_mask, None, num_pairs
            ).item(),
            "rewards_chosen_mean": masked_mean(chosen, pair_mask, None, num_pairs).item(),
            "rewards_rejected_mean": masked_mean(rejected, pair_mask, None, num_pairs).item(),
            "num_valid_samples": sample_mask.sum().item(),
        }
    return loss, metrics


class PreferenceLossFn:
    r"""Reward-model (Bradley-Terry) loss on a scalar-head model.

        loss = sum_pairs -log sigmoid(r_c - r_r) / (global_valid_seqs / 2)

    r = ``logits`` ([B] or [B, 1], the model's score per sequence). No knobs.
    """

    loss_type = LossType.SEQUENCE_LEVEL
    input_type = LossInputType.LOGIT
    samples_per_example = 2

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        logits: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        rewards = logits.reshape(logits.shape[0], -1)
        if rewards.shape[1] != 1:
            raise ValueError(
                f"logits {tuple(logits.shape)} must hold one score per sequence ([B] or [B, 1])"
            )
        rewards = rewards.squeeze(-1)
        loss, metrics = preference_loss(
            rewards, data["sample_mask"].to(rewards.dtype), global_valid_seqs
        )
        return loss, {"loss": loss.item(), **metrics}


class DPOLossFn:
    r"""Direct Preference Optimization (Rafailov 2023) with an optional SFT term.

        rho(y)  = sum_t m_t (log pi(y_t) - log pi_ref(y_t))     [/ sum_t m_t if
                  ``preference_average_log_probs``]
        L_pref  = sum_pairs -log sigmoid(beta (rho(y_c) - rho(y_r))) / (global_valid_seqs / 2)
        L_sft   = sum_pairs -sum_t m_t log pi(y_c,t)  [/ sum_t m_t if ``sft_average_log_probs``]
                  / (global_valid_seqs / 2)
        loss    = ``preference_loss_weight`` L_pref + ``sft_loss_weight`` L_sft

    beta = ``reference_policy_kl_penalty``. Data: ``reference_policy_logprobs``,
    ``token_mask`` [B, S] (position 0 dropped) and ``sample_mask`` [B], pairs interleaved.
    ``cfg`` may be the whole ``dpo:`` section: only the loss keys above are read here.
    """

    loss_type = LossType.SEQUENCE_LEVEL
    input_type = LossInputType.LOGPROB
    samples_per_example = 2

    def __init__(self, cfg: DPOLossConfig | Mapping[str, Any]):
        if isinstance(cfg, Mapping):
            cfg = {key: value for key, value in cfg.items() if key in DPOLossConfig.model_fields}
        self.cfg = validate_section(DPOLossConfig, cfg, "dpo")

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        next_token_logprobs: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = self.cfg
        logprobs = next_token_logprobs
        token_mask = data["token_mask"][:, 1:].to(logprobs.dtype)
        check_aligned("next_token_logprobs", logprobs, token_mask)
        sample_mask = data["sample_mask"].to(logprobs.dtype)
        reference = data["reference_policy_logprobs"][:, 1:].to(logprobs.dtype)

        def per_sequence(values: torch.Tensor, average: bool) -> torch.Tensor:
            total = (values * token_mask).sum(-1)
            return total / token_mask.sum(-1).clamp(min=1) if average else total

        log_ratio = per_sequence(logprobs - reference, cfg.preference_average_log_probs)
        rewards = cfg.reference_policy_kl_penalty * log_ratio
        pref_loss, metrics = preference_loss(rewards, sample_mask, global_valid_seqs)

        nll = per_sequence(-logprobs, cfg.sft_average_log_probs)
        nll_chosen, _ = split_pairs(nll, "next_token_logprobs")
        mask_chosen, mask_rejected = split_pairs(sample_mask, "sample_mask")
        sft_loss = masked_mean(
            nll_chosen,
            mask_chosen * mask_rejected,
            global_normalization_factor=global_valid_seqs / 2,
        )
        loss = cfg.preference_loss_weight * pref_loss + cfg.sft_loss_weight * sft_loss
        return loss, {"loss": loss.item(), "sft_loss": sft_loss.item(), **metrics}
