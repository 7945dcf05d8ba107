"""Draft-model training for speculative decoding."""

from typing import Any

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class DraftCrossEntropyLossFn:
    r"""Soft cross-entropy of the draft model against the target (teacher) model.

        loss = sum_t mask_t ( -sum_v softmax(z^teacher_t)_v log_softmax(z^draft_t)_v )
               / global_valid_toks

    Teaching the full next-token distribution (not just the sampled token) is what
    maximizes the draft's acceptance rate. No knobs; ``mask`` selects the positions.
    """

    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.DRAFT

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        teacher_logits: torch.Tensor,
        student_logits: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        if teacher_logits.shape != student_logits.shape or student_logits.shape[:2] != mask.shape:
            raise ValueError(
                f"teacher_logits {tuple(teacher_logits.shape)} and student_logits "
                f"{tuple(student_logits.shape)} must both be [B, T, V] with mask "
                f"{tuple(mask.shape)} = [B, T]"
            )
        teacher_probs = torch.softmax(teacher_logits.detach().to(student_logits.dtype), dim=-1)
        student_logprobs = torch.log_softmax(student_logits, dim=-1)
        cross_entropy = -(teacher_probs * student_logprobs).sum(-1)
        mask = mask.to(student_logits.dtype)
        loss = masked_mean(cross_entropy, mask, global_normalization_factor=global_valid_toks)
        with torch.no_grad():
            agree = (teacher_logits.argmax(-1) == student_logits.argmax(-1)).to(mask.dtype)
            metrics = {
                "loss": loss.item(),
                "top1_agreement": masked_mean(agree, mask, None, global_valid_toks).item(),
                "num_unmasked_tokens": mask.sum().item(),
            }
        return loss, metrics
