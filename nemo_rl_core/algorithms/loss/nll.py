"""Supervised fine-tuning loss."""

from typing import Any

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.loss.utils import check_aligned
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class NLLLossFn:
    r"""Token-level negative log-likelihood (SFT).

        loss = -sum_t m_t log pi(x_{t+1} | x_{<=t}) / global_valid_toks,
        m_t = token_mask[t+1] * sample_mask

    No knobs: which tokens count is set by ``token_mask`` (e.g. only assistant turns).
    """

    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.LOGPROB

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        next_token_logprobs: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        token_mask = data["token_mask"][:, 1:].to(next_token_logprobs.dtype)
        check_aligned("next_token_logprobs", next_token_logprobs, token_mask)
        sample_mask = data["sample_mask"].to(next_token_logprobs.dtype)
        mask = token_mask * sample_mask.unsqueeze(-1)
        loss = masked_mean(
            -next_token_logprobs, mask, global_normalization_factor=global_valid_toks
        )
        return loss, {
            "loss": loss.item(),
            "num_unmasked_tokens": mask.sum().item(),
            "num_valid_samples": sample_mask.sum().item(),
        }
