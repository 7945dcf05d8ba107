"""Dynamic batching on the Megatron backend (NeMo RL's policy.dynamic_batching and
value.dynamic_batching): token-budget microbatches of different sizes and widths, sorted by
length, give the padded microbatches' logprobs, values and training step, in one process and
over two data-parallel ranks (each planning its own share)."""

from pathlib import Path

import pytest
import torch
from conftest import make_batch, policy_config

from nemo_rl_core.algorithms.loss import ClippedPGLossFn, MseValueLossFn
from nemo_rl_core.models.policy.config import DynamicBatchingConfig, TrainedModelConfig
from nemo_rl_core.models.policy.megatron_policy import MegatronPolicy
from nemo_rl_core.models.value.config import ValueConfig
from nemo_rl_core.models.value.megatron_value import MegatronValue

pytestmark = [pytest.mark.megatron, pytest.mark.e2e]
# Lengths 12, 9, 6 and 10 (rounded to 2) at a budget of 22 tokens: a microbatch of two
# samples cut to width 10, then one of width 10 and one of 12.
BUDGET = DynamicBatchingConfig(
    enabled=True, train_mb_tokens=22, logprob_mb_tokens=22, sequence_length_round=2
)


def dynamic(config: TrainedModelConfig) -> TrainedModelConfig:
    return config.model_copy(update={"dynamic_batching": BUDGET})


def policy_run(model_dir: Path, vocab_size: int, budget: bool, **parallel: int) -> dict:
    config = policy_config(model_dir, "megatron", **parallel)
    policy = MegatronPolicy(dynamic(config) if budget else config)
    data = make_batch(vocab_size, seed=3)
    try:
        before = policy.get_logprobs(data)["logprobs"]
        topk = policy.get_topk_logits(data, k=3)
        result = policy.train(data, ClippedPGLossFn({}))
        after = policy.get_logprobs(data)["logprobs"]
    finally:
        policy.shutdown()
    return {"before": before, "topk": topk["topk_logits"], "after": after, **result}


@pytest.fixture(scope="module")
def padded(tiny_model_dir: Path, vocab_size: int) -> dict:
    return policy_run(tiny_model_dir, vocab_size, budget=False)


@pytest.mark.parametrize("parallel", [{}, {"data_parallel_size": 2}], ids=["one", "dp2"])
def test_policy_with_token_budget_microbatches(tiny_model_dir, vocab_size, padded, parallel):
    got = policy_run(tiny_model_dir, vocab_size, budget=True, **parallel)
    for key in ("before", "after"):
        torch.testing.assert_close(got[key], padded[key], atol=1e-5, rtol=0, msg=key)
    # top-k of the positions that predict a token (past a sample's end: the padding's own)
    lengths = make_batch(vocab_size, seed=3)["input_lengths"]
    valid = torch.arange(got["topk"].shape[1])[None] < (lengths[:, None] - 1)
    torch.testing.assert_close(got["topk"][valid], padded["topk"][valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["loss"], padded["loss"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["grad_norm"], padded["grad_norm"], atol=1e-6, rtol=1e-4)
    # the budget cut the batch into more microbatches than the padded plan's two
    assert len(got["all_mb_metrics"]["loss"]) > len(padded["all_mb_metrics"]["loss"])


def test_value_model_with_token_budget_microbatches(tiny_model_dir, vocab_size):
    data = make_batch(vocab_size, seed=4)
    results = []
    for budget in (False, True):
        config = policy_config(tiny_model_dir, "megatron", ValueConfig)
        value = MegatronValue(dynamic(config) if budget else config)
        try:
            step = value.train(data, MseValueLossFn({"cliprange": None}))
            results.append((step["loss"], value.get_values(data)["values"]))
        finally:
            value.shutdown()
    (padded_loss, padded_values), (got_loss, got_values) = results
    torch.testing.assert_close(got_loss, padded_loss, atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(padded_values[:, 1:]) > 0
    torch.testing.assert_close(got_values, padded_values, atol=1e-5, rtol=0)
