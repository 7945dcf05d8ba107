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
    r"""Clipped squared error of the value model against the GAE returns.

        V^clip_t = V^old_t + clip(V_t - V^old_t, -c, c)           (c = ``value_clip_range``)
        L_t      = 1/2 max((V_t - R_t)^2, (V^clip_t - R_t)^2)      (c = None: 1/2 (V_t - R_t)^2)
        loss     = reduce(L)   (``token_level_loss``: over global_valid_toks, else per
                               sequence mean over global_valid_seqs)

    All [B, S] aligned with input_ids, position 0 dropped: ``values`` (keyword, the
    current model's V_t = estimate of the return from the state before token t, as
    ``ValueInterface.get_values`` returns it; [B, S, 1] is accepted), data ``returns``
    (R_t) and data ``values`` (V^old_t from the rollout's value pass, read only when clipping).
    """

    input_type = LossInputType.LOGIT
    logit_input_key = "values"  # prepare_loss_input passes the model output under this name

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
        values: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        predicted = (values.squeeze(-1) if values.dim() == 3 else values)[:, 1:]
        token_mask = data["token_mask"][:, 1:].to(predicted.dtype)
        check_aligned("values[:, 1:]", predicted, token_mask)
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
