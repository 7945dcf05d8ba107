"""Glue between a model's logits and a loss: input preparation and global reduction.

Training backends call :func:`prepare_loss_input` with the microbatch logits and pass the
result as keyword arguments to the loss, so a loss never needs to know the backend.
"""

from typing import Any

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossFunction, LossInputType, LossType
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def next_token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``log p(input_ids[:, t+1] | <= t)`` for t < S-1: [B, S, V] logits -> [B, S-1].

    Half-precision logits are upcast to float32 first. The gather-minus-logsumexp form
    keeps no [B, S, V] log-softmax alive between forward and backward (the memory that
    bounds large-vocabulary training); on CPU it costs some time (bench/loss_functions.py).
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, S, V] with [B, S] = input_ids "
            f"{tuple(input_ids.shape)}"
        )
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logits = logits[:, :-1]
    targets = input_ids[:, 1:].unsqueeze(-1).long()
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def prepare_loss_input(
    logits: torch.Tensor,
    data: BatchedDataDict,
    loss_fn: LossFunction,
    draft_logits: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The keyword inputs ``loss_fn`` declares through ``loss_fn.input_type``.

    LOGPROB: ``next_token_logprobs`` [B, S-1] from ``data["input_ids"]``.
    LOGIT: ``logits`` as given, under the loss's ``logit_input_key`` when it declares one
    (the value loss takes the value model's output as ``values``).
    DISTILLATION: from ``data["teacher_topk_logits"]``/``["teacher_topk_indices"]`` [B, S, k]:
    ``student_topk_logprobs`` (the student's full-vocabulary log-probs at the teacher's
    top-k ids), ``teacher_topk_logprobs`` (teacher renormalized over its top-k) and
    ``H_all`` = sum_v p_s log p_s (the student's negative entropy), all for positions < S-1.
    DRAFT: ``teacher_logits`` (these logits, detached), ``student_logits`` (``draft_logits``)
    and ``mask`` = token_mask[:, 1:] * sample_mask, for positions < S-1.
    """
    input_type = loss_fn.input_type
    if input_type == LossInputType.LOGIT:
        return {getattr(loss_fn, "logit_input_key", "logits"): logits}
    if input_type == LossInputType.LOGPROB:
        return {"next_token_logprobs": next_token_logprobs_from_logits(logits, data["input_ids"])}
    if input_type == LossInputType.DISTILLATION:
        student_logprobs = torch.log_softmax(_upcast(logits[:, :-1]), dim=-1)
        indices = data["teacher_topk_indices"][:, :-1].long()
        teacher_topk_logits = _upcast(data["teacher_topk_logits"][:, :-1])
        return {
            "student_topk_logprobs": student_logprobs.gather(-1, indices),
            "teacher_topk_logprobs": torch.log_softmax(teacher_topk_logits, dim=-1),
            "H_all": (student_logprobs.exp() * student_logprobs).sum(-1),
        }
    if input_type == LossInputType.DRAFT:
        if draft_logits is None:
            raise ValueError(
                "loss input type DRAFT needs draft_logits= (the draft model's logits, [B, S, V])"
            )
        mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
        return {
            "teacher_logits": logits[:, :-1].detach(),
            "student_logits": draft_logits[:, :-1],
            "mask": mask,
        }
    raise ValueError(f"unsupported loss input_type {input_type!r}")


def reduce_token_loss(
    per_token: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    loss_type: LossType,
    global_valid_seqs: torch.Tensor,
    global_valid_toks: torch.Tensor,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to this microbatch's share of the global loss.

    TOKEN_LEVEL: sum over valid tokens / global_valid_toks.
    SEQUENCE_LEVEL: mean over each sequence's tokens, summed over valid sequences /
    global_valid_seqs. Either way the shares of all microbatches add up to the batch loss.
    """
    if loss_type == LossType.TOKEN_LEVEL:
        mask = token_mask * sample_mask.unsqueeze(-1)
        return masked_mean(per_token, mask, global_normalization_factor=global_valid_toks)
    per_seq = masked_mean(per_token, token_mask, dim=-1)
    return masked_mean(per_seq, sample_mask, global_normalization_factor=global_valid_seqs)


def check_aligned(name: str, tensor: torch.Tensor, reference: torch.Tensor) -> None:
    """Fail early, naming the input, when a loss input is not aligned with the masks."""
    if tensor.shape[:2] != reference.shape[:2]:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}; expected [B, S-1] = "
            f"{tuple(reference.shape[:2])} (data tensors are [B, S] and lose position 0)"
        )


def _upcast(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor
