"""GRPO's generate step samples from per-sample seeds, never from the engine's history."""

import copy

import pytest
from transformers import AutoTokenizer

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.algorithms.prompt_batches import make_dataloader, take_prompts
from nemo_rl_core.algorithms.rollout_generation import generate_rollouts
from nemo_rl_core.models.generation import configure_generation_config, make_generation

CONFIG = "examples/configs/grpo_math_tiny.yaml"


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    config = load_master_config(
        CONFIG,
        [
            "policy.generation.backend=hf",
            "policy.generation.max_new_tokens=12",
            f"policy.model_name={tiny_model_dir}",
        ],
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    settings = configure_generation_config(config.policy.generation, tokenizer)
    engine = make_generation(settings, tiny_model_dir, seed=config.algorithm.seed)
    yield config, tokenizer, engine
    engine.shutdown()


def _responses(batch) -> list[list[int]]:
    return [log[-1]["token_ids"].tolist() for log in batch["message_log"]]


def test_an_iteration_resamples_the_same_tokens_on_an_engine_with_another_history(setup):
    config, tokenizer, engine = setup
    loader = make_dataloader(config, tokenizer)
    first_prompts, state = take_prompts(loader, config, loader.state_dict())
    second_prompts, _ = take_prompts(loader, config, state)

    def generate(prompts, iteration):  # the stage reads fresh prompts from storage each time
        batch, _ = generate_rollouts(
            engine, copy.deepcopy(prompts), tokenizer, {}, config, iteration
        )
        return _responses(batch)

    fresh = generate(first_prompts, 0)
    generate(second_prompts, 1)  # the engine's RNG moves on, as in a warm run
    assert generate(first_prompts, 0) == fresh
    assert generate(first_prompts, 5) != fresh, "another iteration samples other tokens"
