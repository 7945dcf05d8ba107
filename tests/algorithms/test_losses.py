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
from nemo_rl_core.algorithms.utils import calculate_global_valid_counts
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

LOG = math.log


def counts(data):
    seqs, toks = calculate_global_valid_counts(data)
    return {"global_valid_seqs": seqs, "global_valid_toks": toks}


def test_nll_hand_values(pad_front):
    data = BatchedDataDict(
        token_mask=pad_front([[1, 1], [1, 0]]), sample_mask=torch.ones(2, dtype=torch.float64)
    )
    logprobs = torch.tensor([[LOG(0.5), LOG(0.25)], [LOG(0.125), LOG(0.9)]], dtype=torch.float64)
    loss, metrics = NLLLossFn()(next_token_logprobs=logprobs, data=data, **counts(data))
    assert loss.item() == pytest.approx((LOG(2) + LOG(4) + LOG(8)) / 3)
    assert metrics["num_unmasked_tokens"] == 3


def test_prepare_logprob_input_matches_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7, dtype=torch.float64)
    ids = torch.randint(0, 7, (2, 4))
    data = BatchedDataDict(input_ids=ids)
    loss_input, returned = prepare_loss_input(logits, data, NLLLossFn())
    got = loss_input["next_token_logprobs"]
    assert returned is data
    expected = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert got.shape == (2, 3)
    assert torch.allclose(got, expected, atol=1e-12)
    with pytest.raises(ValueError, match="input_ids"):
        prepare_loss_input(logits[:, :3], data, NLLLossFn())
    with pytest.raises(ValueError, match="draft model's logits"):
        prepare_loss_input(logits, data, DraftCrossEntropyLossFn())


def test_preference_loss_hand_values():
    data = BatchedDataDict(sample_mask=torch.ones(4, dtype=torch.float64))
    scores = torch.tensor([[2.0], [1.0], [0.0], [3.0]], dtype=torch.float64)
    loss, metrics = PreferenceLossFn()(
        logits=scores, data=data, global_valid_seqs=torch.tensor(4.0), global_valid_toks=None
    )
    # pairs (2 vs 1) and (0 vs 3)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(3.0))) / 2
    assert loss.item() == pytest.approx(expected)
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["rewards_chosen_mean"] == pytest.approx(1.0)
    assert metrics["rewards_rejected_mean"] == pytest.approx(2.0)
    assert metrics["num_valid_samples"] == 2  # pairs


def dpo_pair(pad_front):
    # chosen: log pi = log .5 twice, log pi_ref = log .25 twice -> rho_c = 2 log 2
    # rejected: one token, log pi = log .25, log pi_ref = log .5 -> rho_r = -log 2
    # NeMo RL's DPO stores the reference's log-prob of token t+1 at position t
    reference = [[LOG(0.25), LOG(0.25), 0.0], [LOG(0.5), 0.0, 0.0]]
    data = BatchedDataDict(
        token_mask=pad_front([[1, 1], [1, 0]]),
        sample_mask=torch.ones(2, dtype=torch.float64),
        reference_policy_logprobs=torch.tensor(reference, dtype=torch.float64),
    )
    logprobs = torch.tensor([[LOG(0.5), LOG(0.5)], [LOG(0.25), -7.0]], dtype=torch.float64)
    return data, logprobs


def test_dpo_hand_built_pair(pad_front):
    data, logprobs = dpo_pair(pad_front)
    loss, metrics = DPOLossFn({"reference_policy_kl_penalty": 0.1})(
        next_token_logprobs=logprobs, data=data, **counts(data)
    )
    margin = 0.1 * (2 * LOG(2) + LOG(2))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-margin)))
    assert metrics["accuracy"] == pytest.approx(1.0)
    # NeMo RL reports the implicit rewards before beta scales them
    assert metrics["rewards_chosen_mean"] == pytest.approx(2 * LOG(2))
    assert metrics["rewards_rejected_mean"] == pytest.approx(-LOG(2))


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
    loss, metrics = DPOLossFn(cfg)(next_token_logprobs=logprobs, data=data, **counts(data))
    margin = 0.1 * (LOG(2) + LOG(2))  # rho_c = 2 log 2 / 2 tokens, rho_r = -log 2 / 1 token
    assert metrics["preference_loss"] == pytest.approx(math.log1p(math.exp(-margin)))
    assert metrics["sft_loss"] == pytest.approx(LOG(2))  # chosen mean NLL
    assert loss.item() == pytest.approx(0.5 * math.log1p(math.exp(-margin)) + 2.0 * LOG(2))
    with pytest.raises(ValueError, match="reference_policy_kl_penalty"):
        DPOLossFn({"reference_policy_kl_penalty": -1.0})
    # beta 0 is allowed (NeMo RL's tests use it): the preference term is log 2 for any pair
    zero, _ = DPOLossFn({"reference_policy_kl_penalty": 0.0})(
        next_token_logprobs=logprobs, data=data, **counts(data)
    )
    assert zero.item() == pytest.approx(LOG(2))


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
# reverse over the top-k plus NeMo RL's term for the student mass outside it:
# H_rest - log(eps) P_rest with log(eps) = -100, P_rest = 0.2
REVERSE_TOPK = sum(q * LOG(q / p) for p, q in zip(P, Q_FULL, strict=True))
OUTSIDE = (H_ALL - sum(q * LOG(q) for q in Q_FULL)) + 100 * 0.2
REVERSE_FULL = REVERSE_TOPK + OUTSIDE


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        ({"kl_type": "forward"}, FORWARD),
        ({"kl_type": "reverse"}, REVERSE),
        ({"kl_type": "mixed", "mixed_kl_weight": 0.3}, 0.3 * FORWARD + 0.7 * REVERSE),
        ({"kl_type": "forward", "zero_outside_topk": True}, FORWARD_FULL),
        ({"kl_type": "reverse", "zero_outside_topk": True}, REVERSE_FULL),
        (
            {"kl_type": "mixed", "zero_outside_topk": True},
            0.5 * FORWARD_FULL + 0.5 * REVERSE_TOPK + 0.5 * OUTSIDE,
        ),
    ],
)
def test_distillation_kl_modes(pad_front, cfg, expected):
    data, logits = distillation_inputs(pad_front)
    loss_fn = DistillationLossFn({"mixed_kl_weight": 0.5, "zero_outside_topk": False, **cfg})
    loss_input, data = prepare_loss_input(logits, data, loss_fn)
    needs_entropy = loss_fn.zero_outside_topk and loss_fn.kl_type != "forward"
    if needs_entropy:
        assert loss_input["H_all"].item() == pytest.approx(H_ALL)
    else:
        assert loss_input["H_all"] is None
    loss, _ = loss_fn(data=data, **counts(data), **loss_input)
    assert loss.item() == pytest.approx(expected)


def test_value_loss_clipping_hand_values():
    # values, returns and the mask are aligned token by token (position 0 counts if masked in)
    data = BatchedDataDict(
        token_mask=torch.tensor([[0.0, 1, 1, 1]], dtype=torch.float64),
        sample_mask=torch.ones(1, dtype=torch.float64),
        returns=torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=torch.float64),
        values=torch.tensor([[0.0, 1.5, 1.5, 2.0]], dtype=torch.float64),
    )
    current = torch.tensor([[99.0, 2.0, 0.5, 1.0]], dtype=torch.float64)
    toks = torch.tensor(3.0)
    loss_fn = MseValueLossFn({"cliprange": 0.2, "scale": 2.0})
    loss_input, _ = prepare_loss_input(current, data, loss_fn)
    loss, metrics = loss_fn(data=data, global_valid_seqs=1, global_valid_toks=toks, **loss_input)
    # token 1: max((2-1)^2, (1.7-1)^2) = 1; token 2: max(.25, (1.3-1)^2) = .25;
    # token 3: max(0, (1.8-1)^2) = .64 (clipping binds); 0.5 * scale * mean
    assert loss.item() == pytest.approx(0.5 * 2.0 * (1.0 + 0.25 + 0.64) / 3)
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 3)
    unclipped, _ = MseValueLossFn({})(
        logits=current.unsqueeze(-1), data=data, global_valid_seqs=1, global_valid_toks=toks
    )
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 0.25 + 0.0) / 3)


def test_draft_cross_entropy_hand_values():
    teacher = torch.tensor([[[0.0, LOG(3.0)]]], dtype=torch.float64)  # probs (.25, .75)
    student = torch.zeros(1, 1, 2, dtype=torch.float64)  # log .5 each
    data = BatchedDataDict(sample_mask=torch.ones(1, dtype=torch.float64))
    mask = torch.ones(1, 1, dtype=torch.float64)
    one = torch.tensor(1.0)
    loss = DraftCrossEntropyLossFn()(teacher, student, mask, data, one, one)
    assert loss.item() == pytest.approx(LOG(2))
    student = torch.tensor([[[0.0, LOG(3.0)]]], dtype=torch.float64)
    loss = DraftCrossEntropyLossFn()(teacher, student, mask, data, one, one)
    assert loss.item() == pytest.approx(-(0.25 * LOG(0.25) + 0.75 * LOG(0.75)))  # teacher entropy


def test_draft_input_teaches_position_t_the_policys_next_position():
    logits = torch.arange(6, dtype=torch.float64).reshape(1, 3, 2)
    data = BatchedDataDict(
        token_mask=torch.tensor([[0.0, 1.0, 1.0]]), student_logits=torch.zeros(1, 3, 2)
    )
    loss_input, _ = prepare_loss_input(logits, data, DraftCrossEntropyLossFn())
    assert loss_input["teacher_logits"][0].tolist() == [[2.0, 3.0], [4.0, 5.0], [0.0, 0.0]]
    assert loss_input["token_mask"].tolist() == [[1.0, 1.0, 0.0]]
