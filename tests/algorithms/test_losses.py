"""NLL, preference, DPO, distillation, value and draft losses on hand-built inputs."""

import math

import pytest
import torch

from nemo_rl_core.algorithms.loss import (
    DistillationLossFn,
    DPOLossFn,
    DraftCrossEntropyLossFn,
    MseValueLossFn,
    NLLLossFn,
    PreferenceLossFn,
    prepare_loss_input,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

LOG = math.log


def counts(data):
    return data["sample_mask"].sum(), (
        data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    ).sum()


def test_nll_hand_values(pad_front):
    data = BatchedDataDict(
        token_mask=pad_front([[1, 1], [1, 0]]), sample_mask=torch.ones(2, dtype=torch.float64)
    )
    logprobs = torch.tensor([[LOG(0.5), LOG(0.25)], [LOG(0.125), LOG(0.9)]], dtype=torch.float64)
    loss, metrics = NLLLossFn()(data, *counts(data), next_token_logprobs=logprobs)
    assert loss.item() == pytest.approx((LOG(2) + LOG(4) + LOG(8)) / 3)
    assert metrics["num_unmasked_tokens"] == 3


def test_prepare_logprob_input_matches_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7, dtype=torch.float64)
    ids = torch.randint(0, 7, (2, 4))
    data = BatchedDataDict(input_ids=ids)
    got = prepare_loss_input(logits, data, NLLLossFn())["next_token_logprobs"]
    expected = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert got.shape == (2, 3)
    assert torch.allclose(got, expected, atol=1e-12)
    with pytest.raises(ValueError, match="input_ids"):
        prepare_loss_input(logits[:, :3], data, NLLLossFn())
    with pytest.raises(ValueError, match="draft_logits"):
        prepare_loss_input(logits, data, DraftCrossEntropyLossFn())


def test_preference_loss_hand_values():
    data = BatchedDataDict(sample_mask=torch.ones(4, dtype=torch.float64))
    scores = torch.tensor([[2.0], [1.0], [0.0], [3.0]], dtype=torch.float64)
    loss, metrics = PreferenceLossFn()(data, torch.tensor(4.0), torch.tensor(0.0), logits=scores)
    # pairs (2 vs 1) and (0 vs 3)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(3.0))) / 2
    assert loss.item() == pytest.approx(expected)
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["rewards_chosen_mean"] == pytest.approx(1.0)
    assert metrics["rewards_rejected_mean"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="even"):
        PreferenceLossFn()(
            data.slice(0, 3), torch.tensor(4.0), torch.tensor(0.0), logits=scores[:3]
        )


def dpo_pair(pad_front):
    # chosen: log pi = log .5 twice, log pi_ref = log .25 twice -> rho_c = 2 log 2
    # rejected: one token, log pi = log .25, log pi_ref = log .5 -> rho_r = -log 2
    data = BatchedDataDict(
        token_mask=pad_front([[1, 1], [1, 0]]),
        sample_mask=torch.ones(2, dtype=torch.float64),
        reference_policy_logprobs=pad_front([[LOG(0.25), LOG(0.25)], [LOG(0.5), 0.0]]),
    )
    logprobs = torch.tensor([[LOG(0.5), LOG(0.5)], [LOG(0.25), -7.0]], dtype=torch.float64)
    return data, logprobs


def test_dpo_hand_built_pair(pad_front):
    data, logprobs = dpo_pair(pad_front)
    loss, metrics = DPOLossFn({"reference_policy_kl_penalty": 0.1})(
        data, *counts(data), next_token_logprobs=logprobs
    )
    margin = 0.1 * (2 * LOG(2) + LOG(2))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-margin)))
    assert metrics["accuracy"] == pytest.approx(1.0)
    assert metrics["rewards_chosen_mean"] == pytest.approx(0.1 * 2 * LOG(2))
    assert metrics["rewards_rejected_mean"] == pytest.approx(-0.1 * LOG(2))


def test_dpo_average_log_probs_and_sft_term(pad_front):
    data, logprobs = dpo_pair(pad_front)
    cfg = {
        "reference_policy_kl_penalty": 0.1,
        "preference_average_log_probs": True,
        "sft_loss_weight": 2.0,
        "preference_loss_weight": 0.5,
        "sft_average_log_probs": True,
        "max_num_steps": 10,  # other dpo: keys belong to the recipe's config, not the loss
    }
    loss, metrics = DPOLossFn(cfg)(data, *counts(data), next_token_logprobs=logprobs)
    margin = 0.1 * (LOG(2) + LOG(2))  # rho_c = 2 log 2 / 2 tokens, rho_r = -log 2 / 1 token
    assert metrics["preference_loss"] == pytest.approx(math.log1p(math.exp(-margin)))
    assert metrics["sft_loss"] == pytest.approx(LOG(2))  # chosen mean NLL
    assert loss.item() == pytest.approx(0.5 * math.log1p(math.exp(-margin)) + 2.0 * LOG(2))
    with pytest.raises(ValueError, match=r"dpo\.reference_policy_kl_penalty"):
        DPOLossFn({"reference_policy_kl_penalty": -1.0})


def distillation_inputs(pad_front):
    """Student probs (0.4, 0.4, 0.2) over a 3-token vocab; teacher top-2 = tokens (0, 1)
    with probs (0.75, 0.25) after renormalization."""
    data = BatchedDataDict(
        input_ids=torch.zeros(1, 2, dtype=torch.long),
        token_mask=pad_front([[1]]),
        sample_mask=torch.ones(1, dtype=torch.float64),
        teacher_topk_logits=torch.tensor([[[LOG(3.0) + 5, 5.0], [0.0, 0.0]]], dtype=torch.float64),
        teacher_topk_indices=torch.tensor([[[0, 1], [0, 1]]]),
    )
    logits = torch.tensor([[[LOG(0.4), LOG(0.4), LOG(0.2)], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    return data, logits


P, Q_RENORM, Q_FULL = (0.75, 0.25), (0.5, 0.5), (0.4, 0.4)
FORWARD = sum(p * LOG(p / q) for p, q in zip(P, Q_RENORM, strict=True))
REVERSE = sum(q * LOG(q / p) for p, q in zip(P, Q_RENORM, strict=True))
FORWARD_FULL = sum(p * LOG(p / q) for p, q in zip(P, Q_FULL, strict=True))
H_ALL = 2 * 0.4 * LOG(0.4) + 0.2 * LOG(0.2)
REVERSE_FULL = H_ALL - sum(q * LOG(p) for p, q in zip(P, Q_FULL, strict=True))


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        ({"kl_type": "forward"}, FORWARD),
        ({"kl_type": "reverse"}, REVERSE),
        ({"kl_type": "mixed", "mixed_kl_weight": 0.3}, 0.3 * FORWARD + 0.7 * REVERSE),
        ({"kl_type": "forward", "zero_outside_topk": True}, FORWARD_FULL),
        ({"kl_type": "reverse", "zero_outside_topk": True}, REVERSE_FULL),
        ({"kl_type": "mixed", "zero_outside_topk": True}, 0.5 * FORWARD_FULL + 0.5 * REVERSE_FULL),
    ],
)
def test_distillation_kl_modes(pad_front, cfg, expected):
    data, logits = distillation_inputs(pad_front)
    loss_fn = DistillationLossFn(cfg)
    loss_input = prepare_loss_input(logits, data, loss_fn)
    assert loss_input["H_all"].item() == pytest.approx(H_ALL)
    loss, _ = loss_fn(data, *counts(data), **loss_input)
    assert loss.item() == pytest.approx(expected)


def test_distillation_needs_h_all_for_reverse_outside_topk(pad_front):
    data, logits = distillation_inputs(pad_front)
    loss_fn = DistillationLossFn({"kl_type": "reverse", "zero_outside_topk": True})
    loss_input = prepare_loss_input(logits, data, loss_fn)
    del loss_input["H_all"]
    with pytest.raises(ValueError, match="H_all"):
        loss_fn(data, *counts(data), **loss_input)


def test_value_loss_clipping_hand_values(pad_front):
    # current values aligned with input_ids: position 0 (no state before it) is ignored
    data = BatchedDataDict(
        token_mask=pad_front([[1, 1, 1]]),
        sample_mask=torch.ones(1, dtype=torch.float64),
        returns=pad_front([[1.0, 1.0, 1.0]]),
        values=pad_front([[1.5, 1.5, 2.0]]),
    )
    current = torch.tensor([[99.0, 2.0, 0.5, 1.0]], dtype=torch.float64)
    loss_fn = MseValueLossFn({"value_clip_range": 0.2})
    loss, metrics = loss_fn(data, *counts(data), **prepare_loss_input(current, data, loss_fn))
    # token 1: max((2-1)^2, (1.7-1)^2) = 1; token 2: max(.25, (1.3-1)^2) = .25;
    # token 3: max(0, (1.8-1)^2) = .64 (clipping binds)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 0.25 + 0.64) / 3)
    assert metrics["value_clipped_fraction"] == pytest.approx(1 / 3)
    unclipped, _ = MseValueLossFn({"value_clip_range": None})(
        data, *counts(data), values=current.unsqueeze(-1)
    )
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 0.25 + 0.0) / 3)


def test_draft_cross_entropy_hand_values():
    teacher = torch.tensor([[[0.0, LOG(3.0)]]], dtype=torch.float64)  # probs (.25, .75)
    student = torch.zeros(1, 1, 2, dtype=torch.float64)  # log .5 each
    mask = torch.ones(1, 1, dtype=torch.float64)
    loss, metrics = DraftCrossEntropyLossFn()(
        BatchedDataDict(), torch.tensor(1.0), torch.tensor(1.0), teacher, student, mask
    )
    assert loss.item() == pytest.approx(LOG(2))
    student = torch.tensor([[[0.0, LOG(3.0)]]], dtype=torch.float64)
    loss, metrics = DraftCrossEntropyLossFn()(
        BatchedDataDict(), torch.tensor(1.0), torch.tensor(1.0), teacher, student, mask
    )
    assert loss.item() == pytest.approx(-(0.25 * LOG(0.25) + 0.75 * LOG(0.75)))  # teacher entropy
    assert metrics["top1_agreement"] == pytest.approx(1.0)
