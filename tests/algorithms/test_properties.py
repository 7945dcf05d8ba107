"""Properties every loss must have: float64 gradients match finite differences, microbatch
shares sum to the full-batch loss, and a packed batch gives the unpacked loss."""

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_rl_core.algorithms.loss import (
    ClippedPGLossFn,
    DistillationLossFn,
    DPOLossFn,
    DraftCrossEntropyLossFn,
    LossFunction,
    LossInputType,
    LossType,
    MseValueLossFn,
    NLLLossFn,
    PreferenceLossFn,
    SequencePackingLossWrapper,
    aggregate_microbatch_metrics,
    prepare_loss_input,
)
from nemo_rl_core.algorithms.utils import calculate_global_valid_counts
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], LossFunction]
    grad_key: str = "_logits"  # the model output the loss differentiates
    # stop-gradient knobs (CISPO, the KL term's score-function weight exp(lp - sg(lp)),
    # which is 1 in value) make the gradient differ from the finite difference of the loss
    # value by design; their gradients are hand-checked in test_clipped_pg / test_filters
    gradcheck: bool = True

    @property
    def pairwise(self) -> bool:
        return isinstance(self.make(), PreferenceLossFn)


CASES = [
    Case("pg_default", lambda: ClippedPGLossFn({}), gradcheck=False),
    Case("pg_no_kl", lambda: ClippedPGLossFn({"reference_policy_kl_penalty": 0.0})),
    Case(
        "pg_all_token_knobs",
        lambda: ClippedPGLossFn(
            {
                "reference_policy_kl_type": "k2",
                "ratio_clip_c": 3.0,
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "tis",
                "truncated_importance_sampling_ratio": 1.1,
                "positive_example_nll_weight": 0.3,
            }
        ),
        gradcheck=False,
    ),
    Case(
        "pg_gspo_sequence",
        lambda: ClippedPGLossFn(
            {
                "sequence_level_importance_ratios": True,
                "token_level_loss": False,
                "reference_policy_kl_penalty": 0.0,
            }
        ),
    ),
    Case(
        "pg_cispo_on_policy_kl",
        lambda: ClippedPGLossFn(
            {
                "use_cispo": True,
                "reference_policy_kl_type": "k1",
                "use_on_policy_kl_approximation": True,
            }
        ),
        gradcheck=False,
    ),
    Case(
        "pg_reinforce",
        lambda: ClippedPGLossFn({"disable_ppo_ratio": True, "reference_policy_kl_penalty": 0.0}),
    ),
    Case("nll", NLLLossFn),
    Case("dpo", lambda: DPOLossFn({"sft_loss_weight": 0.5, "preference_average_log_probs": True})),
    Case("preference", PreferenceLossFn, grad_key="_score"),
    Case(
        "distill_mixed",
        lambda: DistillationLossFn(
            {"kl_type": "mixed", "mixed_kl_weight": 0.3, "zero_outside_topk": False}
        ),
    ),
    Case(
        "distill_reverse_zero_outside",
        lambda: DistillationLossFn(
            {"kl_type": "reverse", "mixed_kl_weight": 0.5, "zero_outside_topk": True}
        ),
    ),
    Case("value_clipped", lambda: MseValueLossFn({"cliprange": 0.5}), grad_key="_value_head"),
    Case("value_scaled", lambda: MseValueLossFn({"scale": 0.4}), grad_key="_value_head"),
    Case("draft", DraftCrossEntropyLossFn, grad_key="_draft_logits"),
]
IDS = [case.name for case in CASES]


def model_output(loss_fn: LossFunction, batch: BatchedDataDict) -> torch.Tensor:
    """What the model would hand to prepare_loss_input for this loss."""
    if isinstance(loss_fn, MseValueLossFn):
        return batch["_value_head"]
    if isinstance(loss_fn, PreferenceLossFn) and loss_fn.input_type == LossInputType.LOGIT:
        return batch["_value_head"][:, -1:]  # one score per sequence (a reward model)
    return batch["_logits"]


def compute(loss_fn: LossFunction, batch: BatchedDataDict, seqs: torch.Tensor, toks: torch.Tensor):
    extra = (
        {"draft_logits": batch["_draft_logits"]}
        if loss_fn.input_type == LossInputType.DRAFT
        else {}
    )
    loss_input, batch = prepare_loss_input(model_output(loss_fn, batch), batch, loss_fn, **extra)
    result = loss_fn(data=batch, global_valid_seqs=seqs, global_valid_toks=toks, **loss_input)
    return result if isinstance(result, tuple) else (result, {})  # the draft loss: a scalar


@pytest.mark.parametrize(
    "case", [case for case in CASES if case.gradcheck], ids=lambda case: case.name
)
def test_gradcheck_float64(case: Case, make_batch):
    loss_fn = case.make()
    batch = make_batch(4, 5, seed=3)
    seqs, toks = calculate_global_valid_counts(batch)
    key = "_value_head" if case.grad_key == "_score" else case.grad_key
    original = batch[key]

    def loss_of(output: torch.Tensor) -> torch.Tensor:
        batch[key] = output
        return compute(loss_fn, batch, seqs, toks)[0]

    assert torch.autograd.gradcheck(
        loss_of, (original.clone().requires_grad_(True),), eps=1e-6, atol=1e-5
    )
    # the gradient is not trivially zero: the loss really depends on the model output
    output = original.clone().requires_grad_(True)
    loss_of(output).backward()
    assert output.grad.abs().sum() > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_microbatch_shares_sum_to_batch_loss(case: Case, make_batch, data):
    loss_fn = case.make()
    unit = 2 if case.pairwise else 1
    num_units = data.draw(st.integers(1, 6), label="units")
    seq_len = data.draw(st.integers(2, 7), label="seq_len")
    seed = data.draw(st.integers(0, 10_000), label="seed")
    batch = make_batch(num_units * unit, seq_len, seed=seed)
    cuts = (
        sorted(data.draw(st.sets(st.integers(1, num_units - 1), max_size=4), label="cuts"))
        if num_units > 1
        else []
    )
    bounds = [0, *[cut * unit for cut in cuts], num_units * unit]

    seqs, toks = calculate_global_valid_counts(batch)
    full_loss, full_metrics = compute(loss_fn, batch, seqs, toks)
    shares = [
        compute(loss_fn, batch.slice(a, b), seqs, toks)
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    assert sum(loss.item() for loss, _ in shares) == pytest.approx(
        full_loss.item(), abs=1e-6, rel=1e-6
    )
    summed = aggregate_microbatch_metrics([metrics for _, metrics in shares])
    for key, value in full_metrics.items():
        assert summed[key] == pytest.approx(value, abs=1e-6, rel=1e-6), key


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("pad_to", [1, 4])
def test_packed_equals_unpacked(case: Case, make_batch, pad_to: int):
    loss_fn = case.make()
    lengths = [5, 2, 7, 3]
    batch = make_batch(4, 8, seed=11, lengths=lengths)
    seqs, toks = calculate_global_valid_counts(batch)
    expected, expected_metrics = compute(loss_fn, batch, seqs, toks)

    padded = [-(-length // pad_to) * pad_to for length in lengths]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    cu_padded = torch.tensor([0, *torch.tensor(padded).cumsum(0).tolist()])

    def pack(values: torch.Tensor) -> torch.Tensor:
        rows = []
        for row, (length, width) in enumerate(zip(lengths, padded, strict=True)):
            piece = values[row, :length]
            rows += [piece, piece.new_zeros((width - length, *piece.shape[1:]))]
        return torch.cat(rows).unsqueeze(0)

    wrapper = SequencePackingLossWrapper(loss_fn, cu, cu_padded)
    assert wrapper.loss_type == loss_fn.loss_type
    if type(loss_fn) is PreferenceLossFn:
        # a per-sequence score is not a token stream: only its pairing matters
        packed_output = torch.zeros(1, int(cu_padded[-1]), dtype=torch.float64)
        for row, start in enumerate(cu_padded[:-1].tolist()):
            packed_output[0, start : start + lengths[row]] = batch["_value_head"][row, -1]
        wrapper = SequencePackingLossWrapper(_FirstScore(loss_fn), cu, cu_padded)
    else:
        packed_output = pack(model_output(loss_fn, batch))
    extra = (
        {"draft_logits": pack(batch["_draft_logits"])}
        if loss_fn.input_type == LossInputType.DRAFT
        else {}
    )
    loss, metrics = wrapper(packed_output, batch, seqs, toks, **extra)
    if loss_fn.input_type == LossInputType.DRAFT:
        expected_metrics = {}
    assert loss.item() == pytest.approx(expected.item(), abs=1e-10)
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, abs=1e-10), key


class _FirstScore(PreferenceLossFn):
    """A scalar-head model scores a packed sequence at its first position."""

    def __init__(self, loss_fn: PreferenceLossFn):
        self.inner = loss_fn

    def __call__(self, logits, data, global_valid_seqs, global_valid_toks):
        return self.inner(
            logits=logits[:, :1],
            data=data,
            global_valid_seqs=global_valid_seqs,
            global_valid_toks=global_valid_toks,
        )


def test_loss_types_declared():
    assert ClippedPGLossFn({}).loss_type == LossType.TOKEN_LEVEL
    assert ClippedPGLossFn({"token_level_loss": False}).loss_type == LossType.SEQUENCE_LEVEL
    for case in CASES:
        loss_fn = case.make()
        assert isinstance(loss_fn, LossFunction)
        assert loss_fn.__doc__ and "loss" in loss_fn.__doc__.lower()
