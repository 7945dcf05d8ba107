"""Responses to a batch of prompts from a generation engine (multi-turn tasks: whole
episodes), each sample drawn with a seed of its own, so that a rerun or resumed stage draws
the same tokens. Training and validation draw from seed streams that never meet."""

from typing import Any

import torch

from nemo_rl_core.algorithms.grpo_config import RLMasterConfig
from nemo_rl_core.data.llm_message_utils import batched_message_log_to_flat_message
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.experience.rollouts import (
    generate_responses,
    response_length_metrics,
    run_multi_turn_rollout,
)
from nemo_rl_core.models.generation.interfaces import GenerationInterface


def generate_rollouts(
    generation: GenerationInterface,
    batch: BatchedDataDict,
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    config: RLMasterConfig,
    iteration: int,
    round_index: int = 0,
    rows: tuple[int, int] | None = None,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Responses for every prompt, or for the prompts ``rows`` ``[start, end)`` of the batch
    (a shard of the stage), each sampled with its own seed, which its place in the whole
    batch decides; multi-turn tasks play the whole episode here. Each dynamic-sampling round
    of an iteration samples with seeds of its own."""
    stream = TRAIN_SEEDS + 2 * round_index  # odd streams are validation's
    seeds = sampling_seeds(config.algorithm.seed, iteration, batch.size, stream)
    if rows is not None:
        batch, seeds = batch.slice(*rows), seeds[rows[0] : rows[1]]
    generation.prepare_for_generation()
    try:
        rollouts, metrics = play_rollouts(generation, batch, tokenizer, task_to_env, config, seeds)
        return rollouts, {**metrics, **generation.take_engine_metrics()}
    finally:
        generation.finish_generation()


def play_rollouts(
    generation: GenerationInterface,
    batch: BatchedDataDict,
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    config: RLMasterConfig,
    seeds: torch.Tensor,
    greedy: bool = False,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """One response per sample (multi-turn tasks: the whole episode, scored as it is played),
    sampled with ``seeds`` so that a rerun draws the same tokens."""
    if config.algorithm.max_rollout_turns > 1:
        # Each turn's seeds follow from these, so a rerun plays the same episodes.
        batch = BatchedDataDict({**batch, "sample_seeds": seeds})
        return run_multi_turn_rollout(
            generation,
            batch,
            tokenizer,
            task_to_env,
            config.policy.max_total_sequence_length,
            config.algorithm.max_rollout_turns,
            greedy=greedy,
        )
    return generate_one_turn(generation, batch, tokenizer, seeds, greedy=greedy)


# Seed streams: training samples (one stream per dynamic-sampling round) and validation
# samples never share a seed.
TRAIN_SEEDS, VALIDATION_SEEDS = 0, 1


def sampling_seeds(seed: int, iteration: int, size: int, stream: int = TRAIN_SEEDS) -> torch.Tensor:
    """Per-sample seeds of one iteration: a rerun or resumed stage samples the same tokens."""
    base = (seed * 1_000_003 + iteration * 10_007 + stream * 7_919_311) % (2**31 - size)
    return torch.arange(base, base + size, dtype=torch.int64)


def generate_one_turn(
    generation: GenerationInterface,
    batch: BatchedDataDict,
    tokenizer: Any,
    seeds: torch.Tensor,
    greedy: bool = False,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """One assistant turn per sample, left unscored: the reward stage asks the environments."""
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    flat, input_lengths = batched_message_log_to_flat_message(
        batch["message_log"], pad_value_dict={"token_ids": pad_id}
    )
    generation_input: BatchedDataDict[Any] = BatchedDataDict(
        {"input_ids": flat["token_ids"], "input_lengths": input_lengths, "sample_seeds": seeds}
    )
    batch, _, _ = generate_responses(
        generation, generation_input, batch, tokenizer, input_lengths, greedy=greedy
    )
    return batch, one_turn_metrics(batch)


def one_turn_metrics(rollouts: BatchedDataDict) -> dict[str, Any]:
    """Generation metrics of one-turn rollouts, from each sample's response (the last message
    of its log): the same for the batch generated whole or in slices joined again."""
    metrics: dict[str, Any] = response_length_metrics(
        [len(log[-1]["token_ids"]) for log in rollouts["message_log"]]
    )
    # NeMo RL's one-turn rollouts go through its multi-turn loop, which reports this name.
    metrics["mean_gen_tokens_per_sample"] = metrics["mean_generation_length"]
    return metrics
