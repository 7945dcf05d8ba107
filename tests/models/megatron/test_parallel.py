"""TP=2 and DP=2 (two gloo ranks under torchrun) give what TP=1/DP=1 gives."""

from pathlib import Path

import pytest
import torch
from conftest import make_batch, policy_config

from nemo_rl_core.algorithms.loss import ClippedPGLossFn
from nemo_rl_core.models.policy.megatron_policy import MegatronPolicy

pytestmark = [pytest.mark.megatron, pytest.mark.e2e]


def _run(model_dir: Path, vocab_size: int, **parallel: int) -> dict[str, torch.Tensor]:
    data = make_batch(vocab_size, seed=2)
    policy = MegatronPolicy(policy_config(model_dir, "megatron", **parallel))
    try:
        before = policy.get_logprobs(data)["logprobs"]
        result = policy.train(data, ClippedPGLossFn({}))
        after = policy.get_logprobs(data)["logprobs"]
    finally:
        policy.shutdown()
    return {"before": before, "after": after, **result}


@pytest.fixture(scope="module")
def single(tiny_model_dir: Path, vocab_size: int) -> dict[str, torch.Tensor]:
    return _run(tiny_model_dir, vocab_size)


@pytest.mark.parametrize(
    "parallel",
    [{"tensor_model_parallel_size": 2}, {"data_parallel_size": 2}],
    ids=["tp2", "dp2"],
)
def test_two_ranks_match_one(tiny_model_dir, vocab_size, single, parallel) -> None:
    got = _run(tiny_model_dir, vocab_size, **parallel)
    torch.testing.assert_close(got["before"], single["before"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["loss"], single["loss"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["grad_norm"], single["grad_norm"], atol=1e-6, rtol=1e-4)
    # The update itself: the same weights give the same logprobs after the step.
    assert not torch.allclose(single["after"], single["before"], atol=1e-4)
    torch.testing.assert_close(got["after"], single["after"], atol=1e-5, rtol=0)
    assert len(got["all_mb_metrics"]["loss"]) == len(single["all_mb_metrics"]["loss"])
