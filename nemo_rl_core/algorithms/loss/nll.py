"""Supervised fine-tuning loss."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.utils import masked_mean


class NLLLossFn:
    r"""Negative log-likelihood (SFT).

        loss = -sum_t m_t log pi(x_{t+1} | x_{<=t}) / global_valid_toks,
        m_t  = token_mask[t+1] * sample_mask

    Which tokens count is set by ``token_mask`` (e.g. only assistant turns). DPO's SFT term
    calls it with ``dpo_loss=True``: a per-sequence sum instead (a mean over the sequence's
    tokens with ``dpo_average_log_probs``).
    """

    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.LOGPROB

    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor | None,
        global_valid_toks: torch.Tensor,
        dpo_loss: bool = False,
        dpo_average_log_probs: bool = False,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        sample_mask = data["sample_mask"]
        mask = data["token_mask"][:, 1:] * sample_mask.unsqueeze(-1)
        if dpo_loss:
            loss = -(next_token_logprobs * mask).sum(-1)
            if dpo_average_log_probs:
                loss = loss / mask.sum(-1).clamp(min=1)
        else:
            loss = -masked_mean(
                next_token_logprobs, mask, global_normalization_factor=global_valid_toks
            )
        return loss, {
            "loss": loss.item() if loss.ndim == 0 else loss,
            "num_unmasked_tokens": mask.sum().item(),
            "num_valid_samples": sample_mask.sum().item(),
        }
