"""FP8 KV-cache scales from observed Q/K/V activations (``calibrate_qkv_fp8_scales``).

Forward hooks on every attention layer's ``q_proj``/``k_proj``/``v_proj`` record the
``percentile`` of |activation| over the valid tokens of each microbatch; the running max
over microbatches, times ``margin``, divided by the largest FP8 E4M3 value, is the scale
a generation engine multiplies its FP8 cache by.
"""

from collections.abc import Callable, Iterable
from typing import Any

import torch

FP8_E4M3_MAX = 448.0
PROJECTIONS = {"q_proj": "q_scale", "k_proj": "k_scale", "v_proj": "v_scale"}


def _percentile_abs(values: torch.Tensor, percentile: float) -> float:
    flat = values.detach().float().abs().reshape(-1)
    if flat.numel() == 0:
        return 0.0
    k = min(max(int(round(percentile / 100.0 * flat.numel())), 1), flat.numel())
    return float(flat.kthvalue(k).values)


def calibrate_qkv_scales(
    model: torch.nn.Module,
    forwards: Iterable[tuple[torch.Tensor, Callable[[], Any]]],
    percentile: float = 99.9,
    margin: float = 1.05,
    include_q: bool = False,
) -> dict[str, Any]:
    """Per-layer scales; ``forwards`` yields (valid-token mask ``[rows, T]``, run-the-forward)."""
    if not 0.0 < percentile <= 100.0:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    if margin <= 0.0:
        raise ValueError(f"margin must be positive, got {margin}")
    wanted = {k: v for k, v in PROJECTIONS.items() if include_q or k != "q_proj"}
    amax: dict[str, dict[str, float]] = {}
    current_mask: list[torch.Tensor] = []

    def hook_for(layer: str, scale_key: str) -> Callable:
        def hook(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            valid = output[current_mask[0].to(output.device)]
            seen = amax.setdefault(layer, {})
            seen[scale_key] = max(seen.get(scale_key, 0.0), _percentile_abs(valid, percentile))

        return hook

    handles = [
        module.register_forward_hook(hook_for(name.rpartition(".")[0], wanted[leaf]))
        for name, module in model.named_modules()
        if (leaf := name.rpartition(".")[2]) in wanted
    ]
    if not handles:
        raise ValueError(f"{type(model).__name__} has no q_proj/k_proj/v_proj modules to calibrate")
    try:
        for mask, run_forward in forwards:
            current_mask[:] = [mask]
            run_forward()
    finally:
        for handle in handles:
            handle.remove()
    layers = {
        layer: {key: value * margin / FP8_E4M3_MAX for key, value in scales.items()}
        for layer, scales in amax.items()
    }
    return {
        "format": "fp8_e4m3",
        "percentile": percentile,
        "margin": margin,
        "include_q": include_q,
        "layers": layers,
    }
