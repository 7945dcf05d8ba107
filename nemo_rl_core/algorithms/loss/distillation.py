"""On-policy distillation from a teacher's top-k logits."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.utils import masked_mean

# log q assumed for the student outside the teacher's top-k under zero_outside_topk
LOG_INFINITESIMAL = -100.0


class DistillationLossFn:
    r"""Token-level KL between teacher p and student q on the teacher's top-k tokens K.

    p = ``teacher_topk_logprobs`` (the teacher renormalized over K); q =
    ``student_topk_logprobs``, renormalized over K unless ``zero_outside_topk``, then the
    student's full-vocabulary log-probs at K:

        forward = sum_{v in K} p (log p - log q),   reverse = sum_{v in K} q (log q - log p)
        kl      = forward | reverse | w forward + (1 - w) reverse      (``kl_type``;
                  w = ``mixed_kl_weight``)

    With ``zero_outside_topk`` and a reverse term, the student mass outside K counts too:
    + (H_rest - log(eps) P_rest) (times 1 - w for "mixed"), H_rest = H_all - sum_K q log q,
    P_rest = 1 - sum_K q, log(eps) = -100.

        loss = sum_t m_t kl_t / global_valid_toks,   m = token_mask[:, 1:] * sample_mask
    """

    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.DISTILLATION

    def __init__(self, cfg: Mapping[str, Any] | Any):
        values = cfg if isinstance(cfg, Mapping) else cfg.model_dump()
        self.kl_type = values["kl_type"]
        self.mixed_kl_weight = values["mixed_kl_weight"]
        self.zero_outside_topk = values["zero_outside_topk"]
        assert self.kl_type in ("forward", "reverse", "mixed"), (
            f"Invalid KL type {self.kl_type!r}: use forward, reverse or mixed"
        )
        assert 0 <= self.mixed_kl_weight <= 1, "Invalid mixed KL weight: must be in [0, 1]"

    def __call__(
        self,
        student_topk_logprobs: torch.Tensor,
        teacher_topk_logprobs: torch.Tensor,
        H_all: torch.Tensor | None,  # noqa: N803 - NeMo RL's keyword
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        q_log, p_log = student_topk_logprobs, teacher_topk_logprobs
        q, p = q_log.exp(), p_log.exp()
        forward = (p * (p_log - q_log)).sum(-1)
        reverse = (q * (q_log - p_log)).sum(-1)
        w = self.mixed_kl_weight
        per_token = {"forward": forward, "reverse": reverse}.get(
            self.kl_type, w * forward + (1.0 - w) * reverse
        )
        if self.zero_outside_topk and self.kl_type != "forward":
            if H_all is None:
                raise ValueError(
                    f"zero_outside_topk with kl_type={self.kl_type!r} needs H_all, the student's "
                    "full-vocabulary entropy (prepare_loss_input computes it)"
                )
            rest_entropy = H_all - (q * q_log).sum(-1)
            rest_mass = 1 - q.sum(-1)
            correction = rest_entropy - LOG_INFINITESIMAL * rest_mass
            per_token = per_token + (
                correction * (1.0 - w) if self.kl_type == "mixed" else correction
            )
        if "token_mask" in data and "sample_mask" in data:
            token_mask = data["token_mask"][:, 1:][:, : per_token.shape[1]]
            mask = token_mask * data["sample_mask"].unsqueeze(-1)
            loss = masked_mean(per_token, mask, global_normalization_factor=global_valid_toks)
        else:
            loss = per_token.mean()
        return loss, {"loss": loss.item(), "num_valid_samples": data["input_ids"].shape[0]}
