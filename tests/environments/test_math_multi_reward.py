"""NeMo RL's multi-reward math environment: three rewards per response (correct, integer,
format), stored by the rollouts as reward1..3 beside their sum."""

import pytest
import torch

from nemo_rl_core.config.base import validate_section
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.config import MathMultiRewardEnvConfig
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.environments.multi_reward_checks import check_multi_reward
from nemo_rl_core.environments.utils import create_env
from nemo_rl_core.experience.rollouts import calculate_rewards, store_rewards

# NeMo RL's own cases (its test_multi_reward_env_step_basic): right and well formed; a
# non-integer wrong answer, well formed; right, but the think tag is never closed
RESPONSES = [
    ("<think>2 + 2 = 4</think>\n<answer>4</answer>", "4", [1.0, 1.0, 1.0]),
    ("<think>3 * 4 = 12</think>\n<answer>12.5</answer>", "12", [0.0, 0.0, 1.0]),
    ("<think>10 - 5 = 5\n<answer>5</answer>", "5", [1.0, 1.0, 0.0]),
]


@pytest.fixture(scope="module")
def env():
    environment = create_env("math_multi_reward", {"num_workers": 1})
    yield environment
    environment.shutdown()


def logs(responses: list[str]) -> list[list[dict]]:
    return [
        [{"role": "user", "content": "?"}, {"role": "assistant", "content": r}] for r in responses
    ]


def test_three_rewards_per_response_and_correctness_first(env):
    result = env.step(
        logs([r for r, _, _ in RESPONSES]), [{"ground_truth": t} for _, t, _ in RESPONSES]
    )
    assert result.rewards.shape == (3, 3)
    assert result.rewards.tolist() == [expected for _, _, expected in RESPONSES]
    assert [o["content"] for o in result.observations] == [
        "Environment: correct",
        "Environment: incorrect",
        "Environment: correct",
    ]
    assert result.answers == ["4", "12.5", "5"]
    assert [m["reward_reason"] for m in result.metadata] == ["correct", "wrong answer", "correct"]


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("<think>x</think>\n<answer>-3</answer>", "-3", (1.0, 0.0, 1.0)),  # '-3' is no digit string
        ("no tags, just 7", "7", (0.0, 0.0, 0.0)),  # the whole response is the answer read
        ("7", "7", (1.0, 1.0, 0.0)),
        ("<think>a</think>\n<answer>1</answer><answer>2</answer>", "2", (1.0, 1.0, 0.0)),
        ("<think>a</think>\n<answer> 12 </answer>", "12", (1.0, 1.0, 1.0)),  # stripped
        ("<think>a</think> <answer>12</answer>", "12", (1.0, 1.0, 0.0)),  # newline required
    ],
)
def test_the_checks_are_plain_string_checks(response, truth, expected):
    rewards, _ = check_multi_reward({"response": response, "ground_truth": truth})
    assert rewards == expected


def test_only_the_math_checker_is_configurable():
    with pytest.raises(ValueError, match="env.math_multi_reward.verifier_type: Input should be"):
        validate_section(
            MathMultiRewardEnvConfig, {"verifier_type": "countdown"}, "env.math_multi_reward"
        )


class OneReward(EnvironmentInterface):
    def step(self, message_log_batch, metadata, *args, **kwargs):
        size = len(message_log_batch)
        return EnvironmentReturn(
            [{"role": "environment", "content": ""}] * size,
            metadata,
            [None] * size,
            torch.ones(size),
            torch.ones(size, dtype=torch.bool),
            None,
        )

    def global_post_process_and_metrics(self, batch):
        return batch, {}


def test_the_rollouts_store_each_component_and_their_sum(env):
    batch = BatchedDataDict(
        message_log=logs([r for r, _, _ in RESPONSES]),
        extra_env_info=[{"ground_truth": t} for _, t, _ in RESPONSES],
        task_name=["math_multi_reward"] * 3,
    )
    store_rewards(batch, calculate_rewards(batch, {"math_multi_reward": env}).rewards)
    assert batch["total_reward"].tolist() == [3.0, 1.0, 2.0]
    assert [batch[f"reward{k}"].tolist() for k in (1, 2, 3)] == [
        [1.0, 0.0, 1.0],
        [1.0, 0.0, 1.0],
        [1.0, 1.0, 0.0],
    ]
    mixed = BatchedDataDict({**batch, "task_name": ["math_multi_reward", "other", "other"]})
    with pytest.raises(ValueError, match="must agree on the number of reward components"):
        calculate_rewards(mixed, {"math_multi_reward": env, "other": OneReward()})
