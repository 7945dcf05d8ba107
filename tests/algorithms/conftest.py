"""Builders of hand-made loss inputs: [B, S] data tensors whose position 0 the losses drop."""

import math

import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def pad_front(values: list[list[float]], first: float = 0.0) -> torch.Tensor:
    """[B, T] values -> [B, T+1] with a dummy position 0 (the prompt token losses skip)."""
    return torch.tensor([[first, *row] for row in values], dtype=torch.float64)


@pytest.fixture
def pg_data():
    """Data for ClippedPGLossFn from per-token (position >= 1) quantities.

    ``ratios`` sets prev_logprobs = curr - log(ratio); ``is_ratios`` sets
    generation_logprobs = prev - log(is_ratio); returns (data, next_token_logprobs).
    """

    def build(
        curr: list[list[float]],
        advantages: list[list[float]],
        ratios: list[list[float]] | None = None,
        is_ratios: list[list[float]] | None = None,
        reference: list[list[float]] | None = None,
        token_mask: list[list[float]] | None = None,
        sample_mask: list[float] | None = None,
    ) -> tuple[BatchedDataDict, torch.Tensor]:
        ones = [[1.0] * len(row) for row in curr]
        ratios = ratios or ones
        is_ratios = is_ratios or ones
        prev = [
            [c - math.log(r) for c, r in zip(cr, rr, strict=True)]
            for cr, rr in zip(curr, ratios, strict=True)
        ]
        gen = [
            [p - math.log(r) for p, r in zip(pr, rr, strict=True)]
            for pr, rr in zip(prev, is_ratios, strict=True)
        ]
        data = BatchedDataDict(
            advantages=pad_front(advantages),
            prev_logprobs=pad_front(prev),
            generation_logprobs=pad_front(gen),
            reference_policy_logprobs=pad_front(reference or curr),
            token_mask=pad_front(token_mask or ones),
            sample_mask=torch.tensor(sample_mask or [1.0] * len(curr), dtype=torch.float64),
        )
        logprobs = torch.tensor(curr, dtype=torch.float64, requires_grad=True)
        return data, logprobs

    return build
