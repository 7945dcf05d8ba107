"""vLLM's CUDA build behind ``VllmGeneration``, skipped where there is no GPU or it is not
installed (the CUDA lock has it: ``make setup`` on a GPU machine, ``bench/gpu_check.sh``).

On a GPU a colocated engine sleeps after each generation (its weights go to host memory,
its GPU memory is released) and the next iteration's refit finds it asleep; on CPU it
never sleeps, so only here can that refit be checked."""

from pathlib import Path

import pytest
import torch
from policy_testing import token_batch
from transformers import AutoModelForCausalLM

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation import GenerationConfig, make_generation

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def generation_config(backend: str) -> GenerationConfig:
    return GenerationConfig.model_validate(
        {
            "backend": backend,
            "max_new_tokens": 12,
            "colocated": {"enabled": True},
            "vllm_cfg": {
                "precision": "float32",
                "max_model_len": 128,
                "gpu_memory_utilization": 0.3,
            },
        }
    )


@pytest.fixture(autouse=True)
def _exact_fp32_matmuls() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def perturbed_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.add_(noise * parameter.std() * 0.5)
    return model.state_dict()


def test_a_sleeping_colocated_engine_is_refit_and_generates_with_the_new_weights(
    tiny_model_dir: Path,
) -> None:
    pytest.importorskip("vllm")
    prompts = token_batch(batch=4, seq=10)
    data = BatchedDataDict(input_ids=prompts["input_ids"], input_lengths=prompts["input_lengths"])
    new_weights = perturbed_state_dict(tiny_model_dir)
    engine = make_generation(generation_config("vllm"), tiny_model_dir)
    try:
        engine.prepare_for_generation()
        before = engine.generate(data, greedy=True)
        engine.finish_generation()  # asleep, as after every generate stage
        engine.update_weights_from_state_dict(new_weights)
        engine.prepare_for_generation()
        after = engine.generate(data, greedy=True)
    finally:
        engine.shutdown()
    reference = make_generation(generation_config("hf"), tiny_model_dir)
    reference.update_weights_from_state_dict(new_weights)
    expected = reference.generate(data, greedy=True)
    assert not torch.equal(before["output_ids"], after["output_ids"]), "the refit changed nothing"
    assert torch.equal(after["output_ids"], expected["output_ids"])
