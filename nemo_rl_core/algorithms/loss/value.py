"""The value-model loss of PPO."""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.config import MseValueLossConfig
from nemo_rl_core.algorithms.loss.interfaces import LossInputType, LossType
from nemo_rl_core.algorithms.utils import masked_mean


class MseValueLossFn:
    r"""Squared error of the value model against the GAE returns, optionally clipped.

        V^clip_t = clip(V_t, V^old_t - c, V^old_t + c)                       (c = ``cliprange``)
        L_t      = max((V_t - R_t)^2, (V^clip_t - R_t)^2)          (c = None or 0: (V_t - R_t)^2)
        loss     = 0.5 * ``scale`` * sum_t m_t L_t / global_valid_toks,  m = token_mask * sample_mask

    ``logits`` is the value model's output V_t, [B, S] (or [B, S, 1]), aligned with the
    tokens like ``token_mask``, data ``returns`` (R_t) and data ``values`` (V^old_t from the
    rollout's value pass, read only when clipping).
    """

    input_type = LossInputType.LOGIT
    loss_type = LossType.TOKEN_LEVEL

    def __init__(self, cfg: MseValueLossConfig | Mapping[str, Any]):
        if not isinstance(cfg, MseValueLossConfig):
            cfg = MseValueLossConfig.model_validate(dict(cfg))
        self.scale = cfg.scale
        self.cliprange = cfg.cliprange

    def __call__(
        self,
        logits: torch.Tensor,
        data: Mapping[str, Any],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        values = logits.squeeze(-1) if logits.dim() > 2 and logits.shape[-1] == 1 else logits
        returns = data["returns"]
        mask = data["token_mask"] * data["sample_mask"].unsqueeze(-1)

        def mean(per_token: torch.Tensor) -> torch.Tensor:
            return masked_mean(per_token, mask, global_normalization_factor=global_valid_toks)

        squared = (values - returns) ** 2
        clip_fraction = 0.0
        if self.cliprange:
            old = data["values"]
            clipped = torch.clamp(values, old - self.cliprange, old + self.cliprange)
            clipped_squared = (clipped - returns) ** 2
            clip_fraction = mean((clipped_squared > squared).float()).item()
            squared = torch.max(squared, clipped_squared)
        loss = 0.5 * self.scale * mean(squared)
        with torch.no_grad():
            kept = values[mask.bool()]
            metrics = {
                "loss": loss.item(),
                "vf_clipfrac": clip_fraction,
                "returns_mean": mean(returns).item(),
                "values_mean": mean(values).item(),
                # no valid token: the neutral elements of min and max, as ClippedPG reports
                # its ratio bounds, so that microbatch values combine exactly
                "values_min": kept.min().item() if kept.numel() else float("inf"),
                "values_max": kept.max().item() if kept.numel() else float("-inf"),
                "returns_sq_mean": mean(returns**2).item(),
                "residual_sq_mean": mean((returns - values) ** 2).item(),
                "num_valid_samples": int(values.shape[0]),
            }
        return loss, metrics
