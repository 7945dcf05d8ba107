"""Glue between a model's logits and a loss: the inputs a loss declares, and one reduction.

Training backends call :func:`prepare_loss_input` with the microbatch logits and pass the
returned inputs as keyword arguments to the loss, so a loss never needs to know the
backend. :func:`reduce_token_loss` is the one place that turns per-token values into a
microbatch's share of the global loss; every loss and backend goes through it.
"""

from collections.abc import MutableMapping
from typing import Any, TypeVar

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossFunction, LossInputType, LossType
from nemo_rl_core.algorithms.utils import masked_mean

DataT = TypeVar("DataT", bound=MutableMapping[str, Any])


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
    logits = _upcast(logits)[:, :-1]
    targets = input_ids[:, 1:].unsqueeze(-1).long()
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def distillation_topk_logprobs(
    student_logits: torch.Tensor,
    teacher_topk_logits: torch.Tensor,
    teacher_topk_indices: torch.Tensor,
    zero_outside_topk: bool,
    calculate_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The student's and teacher's log-probs at the teacher's top-k tokens, positions < S-1.

    With ``zero_outside_topk`` the student's are its full-vocabulary log-probs at those
    tokens (the mass outside the top-k is accounted for by the loss, with ``H_all`` =
    sum_v p log p when ``calculate_entropy``); otherwise both distributions are
    renormalized over the top-k. The teacher's are always renormalized over its top-k.
    """
    k = teacher_topk_indices.shape[-1]
    if k <= 0:
        raise ValueError(
            f"topk must be positive, got {k}: distillation needs at least one teacher token "
            "per position (distillation.topk_logits_k)"
        )
    student_logits = _upcast(student_logits)
    indices = teacher_topk_indices.to(student_logits.device).long()
    entropy = None
    if zero_outside_topk:
        full = torch.log_softmax(student_logits, dim=-1)
        student = full.gather(-1, indices)
        if calculate_entropy:
            entropy = (full.exp() * full).sum(-1)[:, :-1]
    else:
        student = torch.log_softmax(student_logits.gather(-1, indices), dim=-1)
    teacher = torch.log_softmax(teacher_topk_logits.to(student.device, student.dtype), dim=-1)
    return student[:, :-1], teacher[:, :-1], entropy


def prepare_loss_input(
    logits: torch.Tensor,
    data: DataT,
    loss_fn: LossFunction,
    draft_logits: torch.Tensor | None = None,
) -> tuple[dict[str, Any], DataT]:
    """``(loss_input, data)``: the keyword inputs ``loss_fn`` declares through its
    ``input_type``, and the microbatch (returned as NeMo RL's callers expect).

    LOGPROB: ``next_token_logprobs`` [B, S-1] of ``data["input_ids"]``.
    LOGIT: ``logits`` as given.
    DISTILLATION: ``student_topk_logprobs``, ``teacher_topk_logprobs`` [B, S-1, k] and
    ``H_all`` (see :func:`distillation_topk_logprobs`), from ``data["teacher_topk_logits"]``
    / ``["teacher_topk_indices"]`` [B, S, k].
    DRAFT: ``teacher_logits`` (these logits shifted one position left, detached; the last
    position zero), ``token_mask`` shifted the same way and ``student_logits`` (the draft
    model's, ``draft_logits`` or ``data["student_logits"]``).
    """
    input_type = loss_fn.input_type
    if input_type == LossInputType.LOGIT:
        return {"logits": logits}, data
    if input_type == LossInputType.LOGPROB:
        logprobs = next_token_logprobs_from_logits(logits, data["input_ids"])
        return {"next_token_logprobs": logprobs}, data
    if input_type == LossInputType.DISTILLATION:
        forward_only = getattr(loss_fn, "kl_type", "forward") == "forward"
        zero_outside = bool(getattr(loss_fn, "zero_outside_topk", False))
        student, teacher, entropy = distillation_topk_logprobs(
            logits,
            data["teacher_topk_logits"],
            data["teacher_topk_indices"],
            zero_outside_topk=zero_outside,
            calculate_entropy=zero_outside and not forward_only,
        )
        return {
            "student_topk_logprobs": student,
            "teacher_topk_logprobs": teacher,
            "H_all": entropy,
        }, data
    if input_type == LossInputType.DRAFT:
        draft = draft_logits if draft_logits is not None else data.get("student_logits")
        if draft is None:
            raise ValueError(
                "a DRAFT loss needs the draft model's logits: draft_logits= or "
                "data['student_logits'] ([B, S, V])"
            )
        return {
            "teacher_logits": shift_left(logits.detach()),
            "student_logits": draft,
            "token_mask": shift_left(data["token_mask"]),
        }, data
    raise ValueError(f"unknown loss input_type {input_type!r}")


def shift_left(tensor: torch.Tensor) -> torch.Tensor:
    """Position t takes position t+1's value along dim 1; the last position is zero."""
    shifted = torch.zeros_like(tensor)
    shifted[:, :-1] = tensor[:, 1:]
    return shifted


def reduce_token_loss(
    per_token: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    loss_type: LossType,
    global_valid_seqs: torch.Tensor | float,
    global_valid_toks: torch.Tensor | float,
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


def _upcast(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor
