"""Built-in datasets generated from a seed: arithmetic word problems, two-digit additions
(as problems, as SFT demonstrations with their answers, or as preference pairs of a right
and a wrong answer), countdown puzzles and
sliding-puzzle games. The demo and the tests train on these without downloading anything;
the same seed always gives the same rows.
"""

import random
from fractions import Fraction
from typing import Any, Literal

_ITEMS = ["apples", "books", "coins", "marbles", "stickers", "pencils"]
_NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana"]


def arithmetic_word_problems(num_samples: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{"problem", "expected_answer"}`` with one +, -, * or exact / step each."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_samples):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b = rng.randint(2, 60), rng.randint(2, 12)
        kind = rng.choice(["add", "sub", "mul", "div"])
        if kind == "add":
            text, answer = (
                f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
                a + b,
            )
        elif kind == "sub":
            a += b
            text, answer = (
                f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
                a - b,
            )
        elif kind == "mul":
            text, answer = (
                f"{name} has {b} boxes with {a} {item} each. How many {item} in total?",
                a * b,
            )
        else:
            a *= b
            text, answer = (
                f"{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
                a // b,
            )
        rows.append({"problem": text, "expected_answer": str(answer)})
    return rows


ADDITION_RANGE = (10, 99)  # both addends of ``addition_problems``


def is_held_out_addition(a: int, b: int) -> bool:
    """Whether ``a + b`` belongs to the held-out addition problems (about 9% of the pairs).

    Fixed by the pair, not by a seed, so no seed or split of training ever sees a held-out
    pair; taken mod 11 so that every units-digit combination occurs on both sides.
    """
    return (3 * a + 7 * b) % 11 == 0


def addition_pairs(
    num_samples: int, seed: int = 0, held_out: bool = False
) -> list[tuple[int, int]]:
    """Seeded two-digit pairs ``(a, b)``: only held-out pairs, or only the others."""
    rng = random.Random(seed)
    low, high = ADDITION_RANGE
    pairs: list[tuple[int, int]] = []
    while len(pairs) < num_samples:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if is_held_out_addition(a, b) == held_out:
            pairs.append((a, b))
    return pairs


# How an addition asks for its answer: in a box (math-verify's format), or on a last line
# "Answer: <number>" (DAPO's check, ``math_verify_impl: dapo_math_verify``), which a restated
# question ("Answer: 62 + 69") does not pass.
AnswerFormat = Literal["boxed", "answer_line"]
_QUESTION_ENDINGS: dict[str, str] = {
    "boxed": "Put the answer in \\boxed{}.",
    "answer_line": 'End your response with the line "Answer: <number>".',
}


def addition_question(a: int, b: int, answer_format: AnswerFormat = "boxed") -> str:
    """The problem text; it states the answer format itself, so it needs no prompt file."""
    return f"What is {a} + {b}? {_QUESTION_ENDINGS[answer_format]}"


def addition_answer(total: int, answer_format: AnswerFormat = "boxed") -> str:
    """The response a policy learns for an addition: the sum in the format the question asks for."""
    return f"\\boxed{{{total}}}" if answer_format == "boxed" else f"Answer: {total}"


def addition_demonstrations(
    num_samples: int,
    seed: int = 0,
    held_out: bool = False,
    answer_format: AnswerFormat = "boxed",
) -> list[dict[str, Any]]:
    """Chat rows ``{"messages": [user question, assistant answer]}`` of the addition problems:
    SFT data (NeMo RL's ``messages`` format) for the same pairs ``addition_problems`` draws."""
    return [
        {
            "messages": [
                {"role": "user", "content": addition_question(a, b, answer_format)},
                {"role": "assistant", "content": addition_answer(a + b, answer_format)},
            ]
        }
        for a, b in addition_pairs(num_samples, seed, held_out)
    ]


def carry_mistake(a: int, b: int) -> int:
    """The sum a learner gets by forgetting a carry: each digit added mod 10 (``a + b + 10``
    for pairs without a carry, so the mistake always differs from the sum)."""
    digits = (a % 10 + b % 10) % 10 + 10 * ((a // 10 + b // 10) % 10)
    return digits if digits != a + b else a + b + 10


def addition_preferences(
    num_samples: int, seed: int = 0, held_out: bool = False
) -> list[dict[str, Any]]:
    """Preference rows in NeMo RL's ``PreferenceDataset`` format: the question as
    ``context``, the right sum (rank 0, preferred) and the carry mistake (rank 1) as
    ``completions``; odd rows list the rejected completion first, as real data may."""
    rows = []
    for index, (a, b) in enumerate(addition_pairs(num_samples, seed, held_out)):
        completions = [
            {"rank": rank, "completion": [{"role": "assistant", "content": addition_answer(total)}]}
            for rank, total in ((0, a + b), (1, carry_mistake(a, b)))
        ]
        rows.append(
            {
                "context": [{"role": "user", "content": addition_question(a, b)}],
                "completions": completions[::-1] if index % 2 else completions,
            }
        )
    return rows


def addition_problems(
    num_samples: int,
    seed: int = 0,
    held_out: bool = False,
    answer_format: AnswerFormat = "boxed",
) -> list[dict[str, Any]]:
    """Rows ``{"problem", "expected_answer"}``: "What is a + b?" for two-digit ``a`` and ``b``.

    ``held_out=False`` draws only training pairs, ``True`` only held-out pairs
    (``is_held_out_addition``), so validation measures problems never trained on.
    """
    return [
        {"problem": addition_question(a, b, answer_format), "expected_answer": str(a + b)}
        for a, b in addition_pairs(num_samples, seed, held_out)
    ]


def countdown_puzzles(
    num_samples: int, seed: int = 0, num_numbers: int = 4, max_number: int = 25
) -> list[dict[str, Any]]:
    """Rows ``{"problem", "expected_answer", "numbers"}``: reach the target from the numbers.

    The target is the value of a random expression over all the numbers, so every puzzle
    has a solution; answers are checked by the ``countdown`` verifier of the math env.
    """
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    while len(rows) < num_samples:
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        value = Fraction(numbers[0])
        for n in numbers[1:]:
            op = rng.choice("+-*/")
            value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n}[op]
        if value.denominator != 1 or value <= 0:
            continue
        target = int(value)
        text = (
            f"Using the numbers {numbers}, each at most once, and + - * / with parentheses, "
            f"write an expression equal to {target}. Put the expression in \\boxed{{}}."
        )
        rows.append({"problem": text, "expected_answer": str(target), "numbers": numbers})
    return rows


def sliding_puzzle_games(
    num_samples: int, seed: int = 0, size: int = 3, shuffle_moves: int = 10, max_moves: int = 20
) -> list[dict[str, Any]]:
    """Rows ``{"game_state", "max_moves"}``: game ``i`` is drawn from seed ``seed + i``."""
    from nemo_rl_core.environments.games.sliding_puzzle import SlidingPuzzleGameLogic

    config = {"size": size, "shuffle_moves": shuffle_moves}
    return [
        {
            "game_state": SlidingPuzzleGameLogic.generate(config, seed=seed + i),
            "max_moves": max_moves,
        }
        for i in range(num_samples)
    ]
