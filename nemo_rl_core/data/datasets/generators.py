"""Built-in datasets generated from a seed: arithmetic word problems, countdown puzzles and
sliding-puzzle games. The demo and the tests train on these without downloading anything;
the same seed always gives the same rows.
"""

import random
from fractions import Fraction
from typing import Any

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


def countdown_puzzles(
    num_samples: int, seed: int = 0, num_numbers: int = 4, max_number: int = 25
) -> list[dict[str, Any]]:
    """Rows ``{"problem", "expected_answer", "numbers"}``: reach the target from the numbers.

    The target is the value of a random expression over all the numbers, so every puzzle
    has a solution; answers are checked by the ``countdown`` verifier of the math env.
    """
    rng = random.Random(seed)
    rows = []
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
