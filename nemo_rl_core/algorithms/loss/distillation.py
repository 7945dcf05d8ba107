"""On-policy distillation from a teacher's top-k logits."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.config import DistillationLossConfig, validate_section
from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.loss.utils import check_aligned
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class DistillationLossFn:
    r"""Token-level KL between teacher p and student q on the teacher's top-k tokens K.

    p = ``teacher_topk_logprobs`` (the teacher renormalized over K). For q:
    with ``zero_outside_topk`` false, q is the student renormalized over K, and

        forward = sum_{v in K} p (log p - log q),   reverse = sum_{v in K} q (log q - log p);

    with ``zero_outside_topk`` true, q is the student's full-vocabulary distribution and
    the teacher is taken as zero outside K, so terms in log p vanish there:

        forward = sum_{v in K} p (log p - log q),
        reverse = H_all - sum_{v in K} q log p,     H_all = sum_{all v} q log q.

        kl   = forward | reverse | w forward + (1 - w) reverse      (``kl_type``;
               w = ``mixed_kl_weight`` for "mixed")
        loss = sum_t m_t kl_t / global_valid_toks,   m = token_mask[:, 1:] * sample_mask
    """

    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.DISTILLATION

    def __init__(self, cfg: DistillationLossConfig | Mapping[str, Any]):
        self.cfg = validate_section(DistillationLossConfig, cfg, "loss_fn")

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        student_topk_logprobs: torch.Tensor,
        teacher_topk_logprobs: torch.Tensor,
        H_all: torch.Tensor | None = None,  # noqa: N803 - NeMo RL's keyword name
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = self.cfg
        student = student_topk_logprobs
        teacher = teacher_topk_logprobs.to(student.dtype)
        token_mask = data["token_mask"][:, 1:].to(student.dtype)
        check_aligned("student_topk_logprobs", student, token_mask)
        check_aligned("teacher_topk_logprobs", teacher, token_mask)
        mask = token_mask * data["sample_mask"].to(student.dtype).unsqueeze(-1)
        if not cfg.zero_outside_topk:
            student = student - torch.logsumexp(student, dim=-1, keepdim=True)
        teacher_probs, student_probs = teacher.exp(), student.exp()

        forward = (teacher_probs * (teacher - student)).sum(-1)
        if cfg.zero_outside_topk:
            if H_all is None and cfg.kl_type != "forward":
                raise ValueError(
                    "loss_fn.zero_outside_topk with a reverse/mixed kl_type needs H_all "
                    "(the student's sum_v q log q over the full vocabulary)"
                )
            reverse = None if H_all is None else H_all - (student_probs * teacher).sum(-1)
        else:
            reverse = (student_probs * (student - teacher)).sum(-1)

        if cfg.kl_type == "forward":
            kl = forward
        elif cfg.kl_type == "reverse":
            kl = reverse
        else:
            kl = cfg.mixed_kl_weight * forward + (1 - cfg.mixed_kl_weight) * reverse

        def token_mean(values: torch.Tensor) -> torch.Tensor:
            return masked_mean(values, mask, global_normalization_factor=global_valid_toks)

        loss = token_mean(kl)
        with torch.no_grad():
            metrics = {"loss": loss.item(), "forward_kl": token_mean(forward).item()}
            if reverse is not None:
                metrics["reverse_kl"] = token_mean(reverse).item()
            metrics["num_valid_samples"] = data["sample_mask"].sum().item()
        return loss, metrics
