"""The answer check that runs inside math pool workers.

The environment runs ``warm_up`` once before forking its workers, so math-verify, sympy
and their lazily imported parts are loaded in every worker from the start.
"""

import logging
from collections.abc import Callable

from nemo_rl_core.environments.choice_answers import (
    verify_english_choice,
    verify_multilingual_choice,
)
from nemo_rl_core.environments.dapo_math_verifier import compute_score

# The multiple-choice verifiers, by ``env.math.verifier_type``.
CHOICE_VERIFIERS: dict[str, Callable[[tuple[str, str]], tuple[float, str | None]]] = {
    "english_multichoice": verify_english_choice,
    "multilingual_multichoice": verify_multilingual_choice,
}


def verify_math_answer(item: tuple[str, str]) -> tuple[float, str | None]:
    """Reward 1.0 when ``response`` states an answer equal to ``ground_truth``, and that answer.

    Runs inside a pool worker; its time limit is the pool's, so math-verify's own
    signal-based timeouts (which cannot interrupt sympy's C big-integer loops) are off.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    response, ground_truth = item
    targets = (LatexExtractionConfig(), ExprExtractionConfig())
    # As NeMo RL: the ground truth is read as the boxed answer, whatever its notation.
    gold = parse(f"\\boxed{{{ground_truth}}}", extraction_config=targets, parsing_timeout=None)
    if not gold:
        gold = parse(ground_truth, extraction_config=targets, parsing_timeout=None)
    if not gold:
        raise ValueError(f"ground truth {ground_truth!r} has no parsable answer")
    predicted = parse(response, extraction_config=targets, parsing_timeout=None)
    extracted = str(predicted[-1]) if predicted else None
    correct = bool(predicted) and verify(gold, predicted, timeout_seconds=None)
    return (1.0 if correct else 0.0), extracted


def verify_countdown_answer(item: tuple[str, str, list[int]]) -> tuple[float, str | None]:
    """Reward 1.0 when the last ``\\boxed{}`` expression uses only the given numbers (each at
    most once) with + - * / and parentheses, and equals the target exactly."""
    import ast
    import re
    from collections import Counter
    from fractions import Fraction

    response, target, numbers = item
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", response)
    if not boxed:
        return 0.0, None
    expression = boxed[-1].replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return 0.0, expression
    operators = {
        ast.Add: Fraction.__add__,
        ast.Sub: Fraction.__sub__,
        ast.Mult: Fraction.__mul__,
        ast.Div: Fraction.__truediv__,
    }
    used: list[int] = []

    def evaluate(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            return operators[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError("only integers, + - * / and parentheses are allowed")

    try:
        value = evaluate(tree.body)
    except (ValueError, ZeroDivisionError):
        return 0.0, expression
    if Counter(used) - Counter(numbers):
        return 0.0, expression  # a number not given, or used too often
    return (1.0 if value == Fraction(target) else 0.0), expression


def check_answer(item: dict) -> tuple[float, str | None]:
    """Pool entry point: dispatch on the ``verifier`` the environment was configured with."""
    if item["verifier"] == "countdown":
        numbers = item.get("numbers")
        if numbers is None:
            raise ValueError("countdown sample has no 'numbers' in its metadata")
        return verify_countdown_answer((item["response"], item["ground_truth"], numbers))
    if item["verifier"] in CHOICE_VERIFIERS:
        return CHOICE_VERIFIERS[item["verifier"]]((item["response"], item["ground_truth"]))
    if item.get("math_verify_impl") == "dapo_math_verify":
        scored = compute_score(item["response"], item["ground_truth"])
        return scored["score"], scored["pred"]
    return verify_math_answer((item["response"], item["ground_truth"]))


# Checks that touch the lazily imported parts of sympy (simplify, radicals, polynomials,
# sets), run once where workers are forked from, so no worker pays for them on a timed task.
WARMUP_ITEMS = (
    {"verifier": "math", "response": "\\boxed{x^2 - 1}", "ground_truth": "(x-1)(x+1)"},
    {"verifier": "math", "response": "\\boxed{2\\sqrt{2}}", "ground_truth": "\\sqrt{8}"},
    {"verifier": "math", "response": "\\boxed{(1, 2]}", "ground_truth": "(1,2]"},
    {"verifier": "math", "response": "\\boxed{\\sin(\\pi/6)}", "ground_truth": "\\frac{1}{2}"},
    {"verifier": "countdown", "response": "\\boxed{1+2}", "ground_truth": "3", "numbers": [1, 2]},
)


def warm_up() -> None:
    for item in WARMUP_ITEMS:
        check_answer(item)
