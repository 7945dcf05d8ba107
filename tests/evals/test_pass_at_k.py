"""pass@k against the closed form and a count over every k-subset, by hand; avg@n the mean."""

from itertools import combinations
from math import comb

import pytest
import torch

from nemo_rl_core.evals.config import EvalConfig
from nemo_rl_core.evals.eval import eval_cons_k, eval_metrics, eval_pass_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (8, 3, 4, 1 - 5 / 70),  # 1 - C(5,4)/C(8,4)
        (3, 1, 1, 1 / 3),  # pass@1 is the fraction correct
        (6, 0, 3, 0.0),
        (6, 6, 1, 1.0),
        (4, 2, 3, 1.0),  # fewer wrong samples than k: every draw holds a correct one
    ],
)
def test_pass_at_k_is_the_closed_form(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            hits = sum(any(s) for s in combinations(samples, k))
            assert pass_at_k(n, c, k) == pytest.approx(hits / comb(n, k), abs=1e-12)


def test_impossible_counts_are_refused():
    with pytest.raises(ValueError, match="n=2 c=3 k=1"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError, match="k=3"):
        pass_at_k(2, 1, 3)


def test_scores_group_samples_by_prompt():
    # 3 prompts x 4 tests: correct 1, 0 and 4 of them (positive reward counts as correct)
    rewards = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 0.5, 1, 1, 1])
    assert eval_pass_k(rewards, 4, 2) == pytest.approx(0.5 + 0.0 + 1.0)
    scores = eval_metrics(rewards, EvalConfig(num_tests_per_prompt=4, k_value=2))
    assert scores["pass@2"] == pytest.approx(1.5 / 3)
    assert scores["avg@4"] == pytest.approx(4.5 / 12)
    assert (scores["num_prompts"], scores["num_samples"]) == (3, 12)


def test_cons_at_k_is_right_when_the_majority_of_a_subset_is():
    # prompt 1: "b" is wrong, "a" right; of the 6 pairs, {b,b} and the two ties that meet
    # "b" first lose: 3/6. Prompt 2: every sample says the right "c": 1.
    answers = ["b", "a", "a", "b", "c", "c", "c", "c"]
    rewards = torch.tensor([0.0, 1, 1, 0, 1, 1, 1, 1])
    assert eval_cons_k(rewards, 4, 2, extracted_answers=answers) == pytest.approx(0.5 + 1.0)
    assert eval_cons_k(rewards, 4, 5, answers) == 0.0  # NeMo RL's: no 5 of a prompt's 4
    settings = EvalConfig(metric="cons@k", num_tests_per_prompt=4, k_value=2)
    scores = eval_metrics(rewards, settings, answers)
    assert scores["cons@2"] == pytest.approx(0.75)
    assert scores["pass@2"] == pytest.approx((1 - 1 / 6 + 1.0) / 2)


def test_cons_at_k_counts_no_answer_as_an_answer_with_its_reward():
    # two samples extracted nothing (reward 0): None is their majority in 1 of 3 pairs
    rewards = torch.tensor([0.0, 0, 1])
    assert eval_cons_k(rewards, 3, 2, [None, None, "7"]) == pytest.approx(0.0)
    assert eval_cons_k(rewards, 3, 1, [None, None, "7"]) == pytest.approx(1 / 3)
