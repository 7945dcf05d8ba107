"""DAPO's rule-based math check: Minerva's answer normalisation and string match."""

import pytest

from nemo_rl_core.environments.dapo_math_verifier import (
    compute_score,
    is_correct_minerva,
    is_correct_strict_box,
    last_boxed_only_string,
    normalize_final_answer,
    remove_boxed,
    verify,
)


@pytest.mark.parametrize(
    ("answer", "normalized"),
    [
        ("x = 1,000", "1000"),  # the right side of the last "=", commas out of an integer
        ("1,000.5", "1,000.5"),  # not an integer: the comma stays
        ("\\text{5 cm}", "5"),  # spaces and units out, the text wrapper unwrapped
        ("90^\\circ", "90"),
        ("$\\frac12$", "\\frac{1}{2}"),  # shorthand fractions and roots spelled out
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\boxed{7}", "7"),
        ("\\textbf{A} and \\overline{B}", "AandB"),
        ("an apple", "apple"),
        ("pizza slices", "pizzslices"),  # the article removal is literal, as in NeMo RL
        ("  0.5 ", "0.5"),
    ],
)
def test_normalize_final_answer(answer, normalized):
    assert normalize_final_answer(answer) == normalized


def test_the_last_answer_line_is_compared_with_the_ground_truth():
    assert is_correct_minerva("Answer: 3\nanswer : 4 dollars", "4") == (True, "4")
    assert is_correct_minerva("Answer: 0.5", "\\frac{1}{2}") == (False, "0.5")  # no algebra
    assert is_correct_minerva("It is \\boxed{4}", "4") == (False, "[INVALID]")
    extracted = is_correct_minerva("Answer: \\frac12", "so \\boxed{\\frac{1}{2}}", True)
    assert extracted == (True, "\\frac{1}{2}")
    with pytest.raises(ValueError, match="no \\\\boxed"):
        is_correct_minerva("Answer: 1", "1", gt_need_extract=True)


def test_boxed_expressions_are_found_with_their_braces_balanced():
    assert last_boxed_only_string("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == (
        "\\boxed{\\frac{1}{2}}"
    )
    assert last_boxed_only_string("\\boxed{\\frac{1}{2}") is None  # never closes
    assert last_boxed_only_string("no box") is None
    assert remove_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    with pytest.raises(ValueError, match="box error"):
        remove_boxed("\\boxed{1")


def test_strict_box_verify_compares_the_box_exactly():
    assert is_correct_strict_box("so \\boxed{42}", "42") == (1, "42")
    assert is_correct_strict_box("so \\boxed{ 42}", "42") == (-1, " 42")
    assert is_correct_strict_box("\\boxed{42}" + "x" * 100, "42") == (-1, None)  # too early
    paused = "y" * 200 + "\\boxed{42}" + "x" * 100  # 100 characters back from the last pause
    assert is_correct_strict_box(paused, "42", [0, 0, 0, 250]) == (1, "42")
    with pytest.raises(ValueError, match="4 indices"):
        is_correct_strict_box("\\boxed{42}", "42", [1])
    assert verify("so \\boxed{42}", "42", strict_box_verify=True) == (True, "42")


def test_compute_score_reads_the_last_300_characters():
    assert compute_score("x" * 400 + "\nAnswer: 7", "7") == {"score": 1.0, "acc": True, "pred": "7"}
    late = compute_score("Answer: 7\n" + "x" * 400, "7")
    assert late == {"score": 0.0, "acc": False, "pred": "[INVALID]"}
