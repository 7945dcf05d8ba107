"""Countdown verifier: the boxed expression must reach the target with the given numbers."""

import pytest

from nemo_rl_core.data.datasets.generators import countdown_puzzles
from nemo_rl_core.environments.math_verifier import verify_countdown_answer
from nemo_rl_core.environments.utils import create_env

NUMBERS = [3, 7, 25, 2]


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("\\boxed{(25 - 7) * 2}", 1.0),
        ("\\boxed{25 + 7 + 3 - 2 * 0 + 1}", 0.0),  # 0 and 1 are not given
        ("\\boxed{36}", 0.0),  # the target alone uses no numbers
        ("\\boxed{(25 - 7) \\times 2}", 1.0),
        ("\\boxed{25 + 7 + 3 + 2 - 1}", 0.0),
        ("\\boxed{(7 - 3) * (7 + 2)}", 0.0),  # 7 used twice
        ("\\boxed{3 * (25 - 7) / 3 * 2}", 0.0),  # 3 used twice
        ("\\boxed{__import__('os')}", 0.0),
        ("\\boxed{25 / (7 - 7)}", 0.0),
        ("no box", 0.0),
    ],
)
def test_countdown_answers(response, reward):
    assert verify_countdown_answer((response, "36", NUMBERS))[0] == reward


def test_countdown_environment_from_the_registry():
    env = create_env("countdown", {"num_workers": 1, "timeout_seconds": 5})
    try:
        rows = countdown_puzzles(1, seed=0)
        result = env.step(
            [
                [{"role": "assistant", "content": "\\boxed{" + rows[0]["expected_answer"] + "}"}],
                [{"role": "assistant", "content": "\\boxed{(25 - 7) * 2}"}],
            ],
            [
                {"ground_truth": rows[0]["expected_answer"], "numbers": rows[0]["numbers"]},
                {"ground_truth": "36", "numbers": NUMBERS},
            ],
        )
        assert result.rewards.tolist() == [0.0, 1.0]
        assert env.cfg.verifier_type == "countdown"
    finally:
        env.shutdown()
