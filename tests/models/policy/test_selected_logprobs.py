"""The LM head on the needed positions only: the same logprobs, losses and steps as the
full-logits path, and the full path kept for models whose logits are post-processed."""

from pathlib import Path

import pytest
import torch
from policy_testing import policy_config, token_batch
from test_hf_policy import LAYOUTS, max_param_diff, params_of
from transformers import AutoModelForCausalLM

from nemo_rl_core.algorithms.loss import ClippedPGLossFn, DPOLossFn, NLLLossFn
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.policy.selected_logprobs import split_head


def full_head_only(policy) -> None:
    """Force the policy onto the full-logits path, as for a model without a head split."""
    policy.head_splits = lambda model: None


def grpo_batch(policy, seed: int):
    data = token_batch(batch=4, seed=seed)
    start = policy.get_logprobs(data)["logprobs"]
    data["advantages"] = torch.tensor([1.0, -0.5, 0.25, -1.0]).unsqueeze(1).expand_as(start)
    data["prev_logprobs"] = start + 0.01
    data["generation_logprobs"] = start - 0.01
    data["reference_policy_logprobs"] = start
    return data


def preference_batch(seed: int):
    """Two (chosen, rejected) pairs, interleaved."""
    data = token_batch(batch=4, seed=seed)
    data["reference_policy_logprobs"] = torch.full_like(data["token_mask"], -6.0)
    return data


LOSSES = {
    "clipped_pg": lambda policy: (
        ClippedPGLossFn({"reference_policy_kl_penalty": 0.05}),
        grpo_batch(policy, seed=21),
    ),
    "nll": lambda policy: (NLLLossFn(), token_batch(batch=4, seed=22)),
    "dpo": lambda policy: (
        DPOLossFn({"reference_policy_kl_penalty": 0.1, "sft_loss_weight": 0.5}),
        preference_batch(seed=23),
    ),
}


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "tiny_qwen2_dir"])
def test_tiny_models_split_into_body_and_head(model_fixture: str, request) -> None:
    model_dir = request.getfixturevalue(model_fixture)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    body, head = split_head(model)
    assert head is model.get_output_embeddings() and body is model.get_decoder()


# Preference microbatches must hold whole pairs: token budgets could split them.
CASES = [(loss, layout) for loss in sorted(LOSSES) for layout in sorted(LAYOUTS)]
CASES = [(loss, layout) for loss, layout in CASES if loss != "dpo" or layout == "padded"]


@pytest.mark.parametrize(("loss", "layout"), CASES)
def test_train_step_equals_the_full_logits_path(
    tiny_model_dir: Path, layout: str, loss: str
) -> None:
    results = []
    for full in (False, True):
        policy = make_policy(policy_config(tiny_model_dir, **LAYOUTS[layout]))
        if full:
            full_head_only(policy)
        loss_fn, data = LOSSES[loss](policy)
        metrics = policy.train(data, loss_fn)
        results.append((metrics, params_of(policy), policy.get_logprobs(data)["logprobs"]))
    (selected, params, logprobs), (full_path, full_params, full_logprobs) = results
    torch.testing.assert_close(selected["loss"], full_path["loss"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(selected["grad_norm"], full_path["grad_norm"], atol=1e-6, rtol=1e-5)
    assert (
        max_param_diff(params, full_params) < 1e-5
    )  # as test_microbatch_split_gives_the_same_step
    torch.testing.assert_close(logprobs, full_logprobs, atol=1e-5, rtol=0)


def test_microbatch_without_trained_tokens_still_steps(tiny_model_dir: Path) -> None:
    data = token_batch(batch=4, seed=24)
    data["token_mask"][:2] = 0  # the first microbatch of 2 has nothing to train
    policy = make_policy(policy_config(tiny_model_dir))
    before = params_of(policy)
    metrics = policy.train(data, NLLLossFn())
    assert metrics["all_mb_metrics"]["loss"][0] == 0.0
    assert torch.isfinite(metrics["loss"]).all()
    assert max_param_diff(params_of(policy), before) > 0


class ScaledLogits(torch.nn.Module):
    """A causal LM whose forward rescales its head's logits (as soft-capping models do)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def get_decoder(self) -> torch.nn.Module:
        return self.inner.get_decoder()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = out.logits * 0.5
        return out


def test_models_that_post_process_logits_keep_the_full_path(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert split_head(ScaledLogits(model)) is None
    assert split_head(torch.nn.Linear(2, 2)) is None
