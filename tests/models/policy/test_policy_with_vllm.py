"""The policy's checkpoints and refit weights in a real vLLM engine (the CPU build).

A trained policy's checkpoint directory must start a vLLM engine as is, and
``state_dict_for_refit`` must refit it in place; in both cases vLLM's sampling logprobs
(temperature 0.7, processed) must equal the policy's ``get_logprobs`` on the sampled
sequences, which is what makes GRPO's importance ratios start at 1.
"""

import importlib.util
from pathlib import Path

import pytest
import torch
from policy_testing import policy_config, token_batch

from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation import configure_generation_config, make_generation
from nemo_rl_core.models.local_models import build_tiny_model
from nemo_rl_core.models.policy import make_policy

# vLLM found, not imported (tests/models/generation/test_vllm_generation.py says why)
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]
FP32_MAX_GAP = 1e-4  # the generation tests' documented fp32 bound


@pytest.fixture(scope="module")
def head_dim_32_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM-CPU's attention needs head_dim >= 32."""
    return build_tiny_model(tmp_path_factory.mktemp("vllm_policy") / "llama", hidden_size=128)


def prompts(tokenizer) -> BatchedDataDict:
    texts = ["what is the sum of 3 and 4", "hi", "move the tile left", "7 * 8 ="]
    encoded = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(e) for e in encoded)
    ids = [e + [tokenizer.pad_token_id] * (width - len(e)) for e in encoded]
    return BatchedDataDict(
        input_ids=torch.tensor(ids), input_lengths=torch.tensor([len(e) for e in encoded])
    )


def logprob_gap(policy, generation, batch: BatchedDataDict) -> float:
    out = generation.generate(batch, greedy=False)
    sequences = BatchedDataDict(
        input_ids=out["output_ids"], input_lengths=out["unpadded_sequence_lengths"]
    )
    ours = policy.get_logprobs(sequences)["logprobs"]
    positions = torch.arange(out["output_ids"].shape[1]).unsqueeze(0)
    prompt_end = batch["input_lengths"].unsqueeze(1)
    generated = (positions >= prompt_end) & (
        positions < out["unpadded_sequence_lengths"].unsqueeze(1)
    )
    assert generated.any()
    return (ours - out["logprobs"])[generated].abs().max().item()


def test_checkpoint_and_refit_serve_the_policy_logprobs(
    head_dim_32_llama: Path, tmp_path: Path
) -> None:
    generation_cfg = {
        "backend": "vllm",
        "max_new_tokens": 12,
        "temperature": 0.7,
        "vllm_cfg": {"precision": "float32", "max_model_len": 64},
    }
    config = policy_config(
        head_dim_32_llama, max_total_sequence_length=64, generation=generation_cfg
    )
    policy = make_policy(config)
    policy.train(token_batch(batch=4, seed=1), NLLLossFn())
    policy.save_checkpoint(tmp_path / "ckpt")
    settings = configure_generation_config(config.generation, policy.tokenizer)
    generation = make_generation(settings, tmp_path / "ckpt", seed=0)
    try:
        batch = prompts(policy.tokenizer)
        assert logprob_gap(policy, generation, batch) < FP32_MAX_GAP
        for _ in range(3):
            policy.train(token_batch(batch=4, seed=2), NLLLossFn())
        generation.update_weights_from_state_dict(policy.state_dict_for_refit())
        assert logprob_gap(policy, generation, batch) < FP32_MAX_GAP
    finally:
        generation.shutdown()
