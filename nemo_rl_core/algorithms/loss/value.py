"""The value-model loss of PPO."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.config import MseValueLossConfig, validate_section
from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.loss.utils import check_aligned, reduce_token_loss
from nemo_rl_core.algorithms.utils import masked_mean
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class MseValueLossFn:
    r"""Clipped squared error of the value head against the GAE returns.

        V_t      = value-head output at position t-1 (the state before token t)
        V^clip_t = V^old_t + clip(V_t - V^old_t, -c, c)           (c = ``value_clip_range``)
        L_t      = 1/2 max((V_t - R_t)^2, (V^clip_t - R_t)^2)      (c = None: 1/2 (V_t - R_t)^2)
        loss     = reduce(L)   (``token_level_loss``: over global_valid_toks, else per
                               sequence mean over global_valid_seqs)

    ``logits`` is the value head's output [B, S] or [B, S, 1] per input position; data
    ``returns`` and ``values`` (V^old, read only when clipping) are [B, S] aligned with
    input_ids like advantages, so the head's positions :-1 meet the data's 1:.
    """

    input_type = LossInputType.LOGIT

    def __init__(self, cfg: MseValueLossConfig | Mapping[str, Any]):
        self.cfg = validate_section(MseValueLossConfig, cfg, "loss_fn")
        self.loss_type = (
            LossType.TOKEN_LEVEL if self.cfg.token_level_loss else LossType.SEQUENCE_LEVEL
        )

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        logits: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        predicted = (logits.squeeze(-1) if logits.dim() == 3 else logits)[:, :-1]
        token_mask = data["token_mask"][:, 1:].to(predicted.dtype)
        check_aligned("logits[:, :-1]", predicted, token_mask)
        sample_mask = data["sample_mask"].to(predicted.dtype)
        returns = data["returns"][:, 1:].to(predicted.dtype)
        per_token = (predicted - returns).square()
        clipped = torch.zeros_like(per_token)
        if self.cfg.value_clip_range is not None:
            old = data["values"][:, 1:].to(predicted.dtype)
            c = self.cfg.value_clip_range
            predicted_clipped = old + (predicted - old).clamp(-c, c)
            per_token_clipped = (predicted_clipped - returns).square()
            clipped = (per_token_clipped > per_token).to(predicted.dtype)
            per_token = torch.maximum(per_token, per_token_clipped)
        loss = 0.5 * reduce_token_loss(
            per_token, token_mask, sample_mask, self.loss_type, global_valid_seqs, global_valid_toks
        )
        mask = token_mask * sample_mask.unsqueeze(-1)
        with torch.no_grad():
            metrics = {
                "loss": loss.item(),
                "value_clipped_fraction": masked_mean(
                    clipped, mask, None, global_valid_toks
                ).item(),
                "values_mean": masked_mean(predicted, mask, None, global_valid_toks).item(),
                "num_valid_samples": sample_mask.sum().item(),
            }
        return loss, metrics
