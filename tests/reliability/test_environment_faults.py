"""Environment faults: a reward check that raises, hangs past its time limit or loses its
worker gives that sample reward 0 with the reason in its metadata and a counter in the
reward stage's metrics; the batch fails only past ``max_env_failure_fraction``."""

import os
import signal
import threading

import pytest
from reliability_helpers import CONFIG

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.algorithms.scoring import EnvironmentFailureError, score_rollouts
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.math_environment import MathEnvironment

HANG = "\\boxed{9^{9^{9}}}"  # sympy works on a 370-million-digit integer for minutes
# (response, ground truth): one check times out, one raises, one is right, one is wrong.
SAMPLES = [(HANG, "1"), ("\\boxed{4}", ""), ("\\boxed{2}", "2"), ("\\boxed{5}", "3")]


def _batch(samples: list[tuple[str, str]]) -> BatchedDataDict:
    return BatchedDataDict(
        task_name=["math"] * len(samples),
        message_log=[
            [{"role": "user", "content": "Solve."}, {"role": "assistant", "content": response}]
            for response, _ in samples
        ],
        extra_env_info=[{"ground_truth": truth} for _, truth in samples],
    )


def _config(threshold: float):
    return load_master_config(str(CONFIG), [f"grpo.max_env_failure_fraction={threshold}"])


@pytest.fixture(scope="module")
def math_env():
    env = MathEnvironment({"num_workers": 2, "timeout_seconds": 2.0})
    yield env
    env.shutdown()


def test_failed_checks_score_zero_with_reason_and_counters(math_env) -> None:
    scored, metrics = score_rollouts(_batch(SAMPLES), {"math": math_env}, _config(0.5))
    assert scored["total_reward"].tolist() == [0.0, 0.0, 1.0, 0.0]
    reasons = [meta["reward_reason"] for meta in scored["extra_env_info"]]
    assert reasons[0].startswith("timeout") and reasons[1].startswith("error")
    assert reasons[2:] == ["correct", "wrong answer"]
    assert metrics["env_timeout_count"] == 1 and metrics["env_error_count"] == 1
    assert metrics["env_died_count"] == 0 and metrics["env_failed_fraction"] == 0.5


def test_failed_fraction_past_threshold_fails_the_batch(math_env) -> None:
    with pytest.raises(EnvironmentFailureError, match=r"2 of 4 reward checks failed.*0\.25"):
        score_rollouts(_batch(SAMPLES), {"math": math_env}, _config(0.25))


def test_dead_worker_scores_zero_and_the_run_goes_on() -> None:
    env = MathEnvironment({"num_workers": 1, "timeout_seconds": 60})
    try:
        threading.Timer(1.0, os.kill, (env._pool.pids[0], signal.SIGKILL)).start()
        scored, metrics = score_rollouts(
            _batch([(HANG, "1"), ("\\boxed{3}", "3")]), {"math": env}, _config(0.5)
        )
        assert scored["total_reward"].tolist() == [0.0, 1.0]
        assert scored["extra_env_info"][0]["reward_reason"].startswith("died")
        assert metrics["env_died_count"] == 1
    finally:
        env.shutdown()
