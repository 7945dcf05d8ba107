"""Multi-turn rollouts over the sliding puzzle with the real HF backend and the tiny model."""

import pytest
import torch
from transformers import AutoTokenizer

from nemo_rl_core.data.datasets.processed_dataset import rl_collate_fn
from nemo_rl_core.data.interfaces import TaskDataSpec
from nemo_rl_core.data.llm_message_utils import (
    batched_message_log_to_flat_message,
    get_keys_from_message_log,
    message_logs_to_train_data,
)
from nemo_rl_core.data.processors import sliding_puzzle_data_processor
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.games.sliding_puzzle import SlidingPuzzleEnv, SlidingPuzzleGameLogic
from nemo_rl_core.experience.rollouts import calculate_rewards, run_multi_turn_rollout
from nemo_rl_core.models.generation import GenerationConfig, configure_generation_config
from nemo_rl_core.models.generation.interfaces import GenerationInterface

TASK = "sliding_puzzle_game"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf_generation(tiny_model_dir, tokenizer):
    from nemo_rl_core.models.generation.hf_generation import HFGeneration

    config = configure_generation_config(
        GenerationConfig(backend="hf", max_new_tokens=10, model_name=str(tiny_model_dir)),
        tokenizer,
    )
    generation = HFGeneration(config, tiny_model_dir, seed=0)
    yield generation
    generation.shutdown()


def _puzzle_batch(tokenizer, num_games: int, shuffle_moves: int = 12) -> BatchedDataDict:
    spec = TaskDataSpec(task_name=TASK)
    datums = [
        sliding_puzzle_data_processor(
            {
                "game_state": SlidingPuzzleGameLogic.generate(
                    {"size": 3, "shuffle_moves": shuffle_moves}, seed=seed
                ),
                "max_moves": 20,
            },
            spec,
            tokenizer,
            4096,
            seed,
        )
        for seed in range(num_games)
    ]
    return rl_collate_fn(datums)


def _log_len(log) -> int:
    return sum(len(m["token_ids"]) for m in log)


def test_several_turns_and_exact_token_accounting(hf_generation, tokenizer):
    batch = _puzzle_batch(tokenizer, 3)
    initial_lengths = [_log_len(log) for log in batch["message_log"]]
    final, metrics = run_multi_turn_rollout(
        hf_generation,
        batch,
        tokenizer,
        {TASK: SlidingPuzzleEnv()},
        max_seq_len=2048,
        max_rollout_turns=3,
    )
    assert [len(log) for log in batch["message_log"]] == [1, 1, 1], "input batch untouched"
    assert final["num_turns"].tolist() == [3, 3, 3]  # a random model never solves the board
    assert metrics["avg_turns_per_sample"] == 3 and metrics["max_turns_reached_rate"] == 1.0
    # A random model never stops on its own: each response runs into max_new_tokens, which
    # NeMo RL counts as truncated (the episode still goes on to its last turn).
    assert final["truncated"].all() and metrics["truncation_rate"] == 1.0
    gen_total = env_total = 0
    for log, start in zip(final["message_log"], initial_lengths, strict=True):
        assert [m["role"] for m in log] == ["user"] + ["assistant", "environment"] * 3
        for message in log[1:]:
            if message["role"] == "assistant":
                assert 0 < len(message["token_ids"]) <= 10
                assert message["generation_logprobs"].shape == message["token_ids"].shape
                assert (message["generation_logprobs"] <= 0).all()
                gen_total += len(message["token_ids"])
            else:
                ids = tokenizer(message["content"], add_special_tokens=False)["input_ids"]
                assert message["token_ids"].tolist() == ids
                env_total += len(message["token_ids"])
        assert _log_len(log) > start
    assert metrics["mean_gen_tokens_per_sample"] == pytest.approx(gen_total / 3)
    assert metrics["mean_env_tokens_per_sample"] == pytest.approx(env_total / 3)
    assert metrics["max_generation_length"] <= 10 and metrics["env_time_s"] > 0
    flat, lengths = batched_message_log_to_flat_message(
        [get_keys_from_message_log(log, ["token_ids"]) for log in final["message_log"]],
        pad_value_dict={"token_ids": tokenizer.pad_token_id},
    )
    for i, log in enumerate(final["message_log"]):
        assert lengths[i] == _log_len(log)
        assert torch.equal(
            flat["token_ids"][i, : lengths[i]], torch.cat([m["token_ids"] for m in log])
        )
    train = message_logs_to_train_data(final["message_log"], tokenizer.pad_token_id)
    assert train["token_mask"].sum().item() == gen_total
    assert train["generation_logprobs"].shape == train["input_ids"].shape


def test_max_seq_len_truncates_and_is_never_exceeded(hf_generation, tokenizer):
    batch = _puzzle_batch(tokenizer, 2)
    longest = max(_log_len(log) for log in batch["message_log"])
    max_seq_len = longest + 25
    final, metrics = run_multi_turn_rollout(
        hf_generation, batch, tokenizer, {TASK: SlidingPuzzleEnv()}, max_seq_len=max_seq_len
    )
    assert final["truncated"].all() and metrics["truncation_rate"] == 1.0
    assert all(_log_len(log) <= max_seq_len for log in final["message_log"])
    assert (final["num_turns"] >= 1).all()
    assert metrics["natural_termination_rate"] == 0.0


class ScriptedGeneration(GenerationInterface):
    """A one-game policy that plays a fixed list of responses, one per turn."""

    def __init__(self, tokenizer, responses: list[str]):
        self.tokenizer, self.responses, self.turn = tokenizer, responses, 0

    def generate(self, data, greedy):
        assert len(data["input_lengths"]) == 1
        length = int(data["input_lengths"][0])
        text = self.responses[self.turn]
        self.turn += 1
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        output_ids = torch.cat([data["input_ids"][0, :length], ids])[None]
        return BatchedDataDict(
            {
                "output_ids": output_ids,
                "generation_lengths": torch.tensor([len(ids)]),
                "unpadded_sequence_lengths": torch.tensor([output_ids.shape[1]]),
                "logprobs": torch.zeros(output_ids.shape),
            }
        )

    def prepare_for_generation(self, *args, **kwargs):
        return True

    def finish_generation(self, *args, **kwargs):
        return True


def test_optimal_player_through_the_rollout_gets_reward_one(tokenizer):
    batch = _puzzle_batch(tokenizer, 1, shuffle_moves=10)
    state = batch["extra_env_info"][0]["game_state"]
    actions = SlidingPuzzleGameLogic.optimal_actions(state)
    responses = ["<action>view</action>"] + [f"<action>{a}</action>" for a in actions]
    final, metrics = run_multi_turn_rollout(
        ScriptedGeneration(tokenizer, responses),
        batch,
        tokenizer,
        {TASK: SlidingPuzzleEnv()},
        max_seq_len=4096,
    )
    assert final["total_reward"].tolist() == [1.0]
    assert final["terminated"].tolist() == [True]
    assert final["num_turns"].tolist() == [len(responses)]
    assert metrics["natural_termination_rate"] == 1.0
    assert SlidingPuzzleGameLogic.is_solved(final["extra_env_info"][0]["game_state"])


def test_calculate_rewards_names_a_task_without_environment(tokenizer):
    batch = _puzzle_batch(tokenizer, 1)
    batch["task_name"] = ["chess"]
    with pytest.raises(KeyError, match="'chess'.*sliding_puzzle_game"):
        calculate_rewards(batch, {TASK: SlidingPuzzleEnv()})


def _episode_tokens(batch) -> list[list[int]]:
    return [torch.cat([m["token_ids"] for m in log]).tolist() for log in batch["message_log"]]


def test_seeded_episode_replays_whatever_the_engine_did_before(hf_generation, tokenizer):
    """A resumed run replays an iteration on an engine with another history: same tokens."""
    envs = {TASK: SlidingPuzzleEnv()}
    batch = _puzzle_batch(tokenizer, 2)
    batch["sample_seeds"] = torch.tensor([1234, 1235])

    def play(data):
        final, _ = run_multi_turn_rollout(hf_generation, data, tokenizer, envs, 2048, 2)
        return _episode_tokens(final)

    first = play(batch)
    other = _puzzle_batch(tokenizer, 3, shuffle_moves=5)
    other["sample_seeds"] = torch.tensor([7, 8, 9])
    play(other)
    assert play(batch) == first
    batch["sample_seeds"] = torch.tensor([99, 100])
    assert play(batch) != first, "the seeds must steer sampling"
