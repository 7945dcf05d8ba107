"""The answer check that runs inside math pool workers.

Kept apart from ``math_environment`` so a spawned worker imports math-verify only, not
torch: worker start-up (and restart after a killed check) stays a few seconds.
"""

import logging


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
