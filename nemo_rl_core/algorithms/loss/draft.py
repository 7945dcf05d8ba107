"""Draft-model training for speculative decoding."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.utils import masked_mean


class DraftCrossEntropyLossFn:
    r"""Soft cross-entropy of the draft model against the policy (its teacher).

        loss = sum_t m_t ( -sum_v softmax(z^teacher_t)_v log_softmax(z^draft_t)_v )
               / global_valid_toks,    m = token_mask * sample_mask

    Teaching the full next-token distribution (not just the sampled token) is what
    maximizes the draft's acceptance rate. Returns the scalar loss only, as NeMo RL's does
    (the policy adds it to its own loss, weighted by ``policy.draft.loss_weight``).
    """

    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.DRAFT

    def __init__(self, vocab_parallel_group: Any = None):
        if vocab_parallel_group is not None:
            raise NotImplementedError(
                "a vocabulary-parallel draft loss needs tensor parallelism, which this "
                "deployment's draft training does not use"
            )
        self.vocab_parallel_group = vocab_parallel_group

    def __call__(
        self,
        teacher_logits: torch.Tensor,
        student_logits: torch.Tensor,
        token_mask: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> torch.Tensor:
        teacher_probs = torch.softmax(teacher_logits.detach().to(student_logits.dtype), dim=-1)
        per_token = -(teacher_probs * torch.log_softmax(student_logits, dim=-1)).sum(-1)
        mask = token_mask * data["sample_mask"].unsqueeze(-1)
        return masked_mean(per_token, mask, global_normalization_factor=global_valid_toks)
