"""DAPO's rule-based math check: NeMo RL's ``env.math.math_verify_impl: dapo_math_verify``.

The last ``Answer: ...`` line of the response's final 300 characters and the ground truth
are both normalised the way Minerva normalised final answers (Lewkowycz et al. 2022,
appendix D: units and filler words dropped, ``\\text{}`` and ``$`` unwrapped, shorthand
``\\frac12`` spelled out), then compared as strings. There is no algebra, so a check
never hangs, and ``0.5`` does not match ``\\frac{1}{2}``. ``strict_box_verify`` compares
the last ``\\boxed{}`` of the final 100 characters with the ground truth exactly.
"""

import re
from typing import Any

BOXED = "\\boxed{"
ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"
INVALID = "[INVALID]"  # what an answer line that is not there normalises from
SCORED_TAIL = 300  # characters of a response read (MATH-500's longest answer has 159)
STRICT_BOX_TAIL = 100

# Minerva's normalisation, applied in this order: replacements first, then removals.
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
REMOVED_EXPRESSIONS: tuple[str, ...] = (
    *("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units"),
    *("\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm"),
    *("gm", "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples"),
    *("\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}"),
    *("\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots"),
)
_UNWRAPPED_COMMANDS = ("text", "textbf", "overline")  # \cmd{x} -> x, the first on a line


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` of ``string``, braces balanced; None if there is none or it
    never closes."""
    start = string.rfind(BOXED)
    if start < 0:
        return None
    depth = 0
    for end in range(start + len(BOXED) - 1, len(string)):
        if string[end] == "{":
            depth += 1
        elif string[end] == "}":
            depth -= 1
            if depth == 0:
                return string[start : end + 1]
    return None


def remove_boxed(s: str) -> str:
    """What ``\\boxed{...}`` holds; ``s`` must be exactly one boxed expression."""
    if not s.startswith(BOXED) or not s.endswith("}"):
        raise ValueError(f"box error: {s!r} is not one \\boxed{{...}} expression")
    return s[len(BOXED) : -1]


def normalize_final_answer(final_answer: str) -> str:
    """The answer as Minerva compares it: the right side of its last ``=``, without units,
    spaces, ``$`` and text wrappers, shorthand fractions and roots braced, commas dropped
    from a plain integer."""
    answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in REMOVED_EXPRESSIONS:
        answer = answer.replace(expression, "")
    answer = re.sub(r".*?\$(.*?)\$.*", r"$\1$", answer)  # the first $...$ of each line
    for command in _UNWRAPPED_COMMANDS:
        answer = re.sub(rf"\\{command}\{{(.*?)\}}", r"\1", answer)
    answer = re.sub(r"\\boxed\{(.*)\}", r"\1", answer)
    answer = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", answer)  # \frac12 -> \frac{1}{2}
    answer = re.sub(r"sqrt([^{])", r"sqrt{\1}", answer)  # \sqrt2 -> \sqrt{2}
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def is_correct_minerva(
    solution_str: str,
    gt: str,
    gt_need_extract: bool = False,
    answer_pattern: str = ANSWER_PATTERN,
) -> tuple[bool, str]:
    """Whether the last ``answer_pattern`` match of the solution, normalised, equals the
    normalised ground truth (its last ``\\boxed{}`` when ``gt_need_extract``); and that
    normalised prediction."""
    found = re.findall(answer_pattern, solution_str)
    prediction = normalize_final_answer(found[-1] if found else INVALID)
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        if boxed is None:
            raise ValueError(f"ground truth {gt!r} has no \\boxed{{}} answer to extract")
        gt = remove_boxed(boxed)
    return prediction == normalize_final_answer(gt), prediction


def is_correct_strict_box(
    pred: str, gt: str, pause_tokens_index: list[int] | None = None
) -> tuple[int, str | None]:
    """1 when the last ``\\boxed{}`` in the final 100 characters (counted back from the
    last of four pause tokens, when given) holds exactly ``gt``, else -1; and what it held."""
    if pause_tokens_index is None:
        tail = pred[-STRICT_BOX_TAIL:]
    elif len(pause_tokens_index) != 4:
        raise ValueError(f"pause_tokens_index needs 4 indices, got {pause_tokens_index!r}")
    else:
        tail = pred[pause_tokens_index[-1] - STRICT_BOX_TAIL :]
    boxed = last_boxed_only_string(tail)
    extracted = None if boxed is None else remove_boxed(boxed)
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str,
    answer: str,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> tuple[bool, str | None]:
    """Whether the solution is right, by the strict box rule or Minerva's; and its answer."""
    if strict_box_verify:
        score, extracted = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, extracted
    return is_correct_minerva(solution_str, answer)


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """``{"score": 1.0 or 0.0, "acc": bool, "pred": the answer read}`` for the last 300
    characters of the solution."""
    correct, prediction = verify(
        solution_str[-SCORED_TAIL:], ground_truth, strict_box_verify, pause_tokens_index
    )
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": prediction}
