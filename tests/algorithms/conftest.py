"""Builders of hand-made loss inputs: [B, S] data tensors whose position 0 the losses drop."""

import math

import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


@pytest.fixture(name="pad_front")
def pad_front_fixture():
    """The helper :func:`pad_front`."""
    return pad_front


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


@pytest.fixture
def make_batch():
    """The builder :func:`random_batch`."""
    return random_batch


def random_batch(
    batch_size: int,
    seq_len: int,
    seed: int,
    vocab: int = 5,
    topk: int = 3,
    lengths: list[int] | None = None,
) -> BatchedDataDict:
    """A float64 batch with every key any loss reads, plus the model outputs under
    ``_logits`` [B, S, V], ``_draft_logits`` [B, S, V] and ``_value_head`` [B, S] so that
    slicing the batch slices the outputs with it. Tokens past ``lengths`` are masked."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    token_mask = (torch.rand(batch_size, seq_len, generator=gen) < 0.8).double()
    token_mask[:, 0] = 0.0
    if lengths is not None:
        for row, length in enumerate(lengths):
            token_mask[row, length:] = 0.0
    prev = -2 * torch.rand(batch_size, seq_len, generator=gen, dtype=torch.float64)
    return BatchedDataDict(
        input_ids=torch.randint(0, vocab, (batch_size, seq_len), generator=gen),
        token_mask=token_mask,
        sample_mask=(torch.rand(batch_size, generator=gen) < 0.85).double(),
        advantages=randn(batch_size, seq_len),
        prev_logprobs=prev,
        generation_logprobs=prev + 0.2 * randn(batch_size, seq_len),
        reference_policy_logprobs=prev + 0.2 * randn(batch_size, seq_len),
        returns=randn(batch_size, seq_len),
        values=randn(batch_size, seq_len),
        teacher_topk_logits=randn(batch_size, seq_len, topk),
        teacher_topk_indices=torch.rand(batch_size, seq_len, vocab, generator=gen).argsort(-1)[
            ..., :topk
        ],
        _logits=randn(batch_size, seq_len, vocab),
        _draft_logits=randn(batch_size, seq_len, vocab),
        _value_head=randn(batch_size, seq_len),
    )
