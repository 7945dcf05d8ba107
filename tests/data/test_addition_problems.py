"""The addition generator: seeded, and its held-out pairs never reach the training split."""

from nemo_rl_core.data.datasets.generators import (
    ADDITION_RANGE,
    addition_pairs,
    addition_problems,
    is_held_out_addition,
)


def test_training_and_held_out_pairs_are_disjoint():
    train = set(addition_pairs(4000, seed=1))
    held_out = set(addition_pairs(400, seed=1, held_out=True))
    assert train and held_out and not train & held_out
    assert all(is_held_out_addition(a, b) for a, b in held_out)


def test_held_out_pairs_cover_every_units_digit_combination():
    low, high = ADDITION_RANGE
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    held_out = [(a, b) for a, b in pairs if is_held_out_addition(a, b)]
    assert 0.05 < len(held_out) / len(pairs) < 0.15
    assert {(a % 10, b % 10) for a, b in held_out} == {(i, j) for i in range(10) for j in range(10)}


def test_rows_are_seeded_and_answered():
    assert addition_problems(20, seed=3) == addition_problems(20, seed=3)
    assert addition_problems(20, seed=3) != addition_problems(20, seed=4)
    for row in addition_problems(50, seed=0):
        a, b = (int(x) for x in row["problem"].removeprefix("What is ").split("?")[0].split(" + "))
        assert row["expected_answer"] == str(a + b)
        assert "\\boxed{}" in row["problem"]


def test_answer_line_additions_are_scored_by_dapo_and_not_by_the_question():
    """The answer-line built-ins (issue 31): the question asks for DAPO's "Answer:" line, the
    demonstration answers with the sum there, and restating the question scores 0."""
    from nemo_rl_core.data.config import DataConfig
    from nemo_rl_core.data.datasets.builder import load_rows
    from nemo_rl_core.environments.dapo_math_verifier import compute_score

    problems = load_rows(
        DataConfig.model_validate(
            {"validation": [{"dataset_name": "addition_answer_line", "num_samples": 8}]}
        ),
        "validation",
    )
    demonstrations = load_rows(
        DataConfig.model_validate(
            {"train": [{"dataset_name": "addition_answer_line_sft", "num_samples": 8}]}
        ),
        "train",
    )
    for row in problems:
        a, b = (int(x) for x in row["problem"].removeprefix("What is ").split("?")[0].split(" + "))
        assert is_held_out_addition(a, b)
        assert row["problem"].endswith('End your response with the line "Answer: <number>".')
        assert compute_score(f"Answer: {a} + {b}", row["expected_answer"])["score"] == 0.0
        assert compute_score(f"Answer: {a + b}", row["expected_answer"])["score"] == 1.0
    for row in demonstrations:
        question, answer = (m["content"] for m in row["messages"])
        a, b = (int(x) for x in question.removeprefix("What is ").split("?")[0].split(" + "))
        assert not is_held_out_addition(a, b)
        assert answer == f"Answer: {a + b}"
