"""Validation of the weights a run holds, as NeMo RL's GRPO validates (accuracy of sampled
responses, pass@k, and greedy accuracy), shared by every algorithm that generates."""

from collections.abc import Iterable
from typing import Any

import torch

from nemo_rl_core.algorithms.grpo_config import RLMasterConfig
from nemo_rl_core.algorithms.rollout_generation import (
    VALIDATION_SEEDS,
    play_rollouts,
    sampling_seeds,
)
from nemo_rl_core.algorithms.scoring import score_rollouts
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.models.generation.interfaces import GenerationInterface


def validate_batches(
    generation: GenerationInterface,
    batches: Iterable[BatchedDataDict],
    tokenizer: Any,
    task_to_env: dict[str, EnvironmentInterface],
    config: RLMasterConfig,
    step: int,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Every sample's validation result and the metrics of the weights of ``step``.

    Each prompt gets ``num_generations_per_prompt`` sampled responses (the generation
    settings, seeded apart from training's) and one greedy response. ``accuracy`` is NeMo
    RL's (mean reward of the sampled responses), ``pass@k`` the fraction of prompts with a
    rewarded sample among k, ``greedy_accuracy`` the mean reward of the greedy responses.
    A sample counts as solved when its reward is positive.
    """
    loop = config.algorithm
    k = loop.num_generations_per_prompt
    limit = loop.max_val_samples
    batch_size = loop.val_batch_size
    if limit is not None and batch_size is not None:
        limit = (limit // batch_size) * batch_size  # NeMo RL validates whole batches
    results: list[BatchedDataDict] = []
    taken = 0
    generation.prepare_for_generation()
    try:
        for prompts in batches:
            if limit is not None and taken >= limit:
                break
            if limit is not None and taken + prompts.size > limit:
                prompts = prompts.slice(0, limit - taken)
            prompts["prompt_index"] = torch.arange(taken, taken + prompts.size)
            sampled = prompts.repeat_interleave(k)
            seeds = sampling_seeds(loop.seed, step, (taken + prompts.size) * k, VALIDATION_SEEDS)
            sampled, _ = play_rollouts(
                generation, sampled, tokenizer, task_to_env, config, seeds[taken * k :]
            )
            greedy, _ = play_rollouts(
                generation, prompts, tokenizer, task_to_env, config, seeds[: prompts.size], True
            )
            for played, is_greedy in ((sampled, False), (greedy, True)):
                scored, _ = score_rollouts(played, task_to_env, config)
                scored["greedy"] = torch.full((scored.size,), is_greedy)
                results.append(scored)
            taken += prompts.size
    finally:
        generation.finish_generation()
    if not results:
        raise ValueError("validation has no prompts: the validation dataset is empty")
    table: BatchedDataDict[Any] = BatchedDataDict.from_batches(results)
    return table, validation_metrics(table, k)


def validation_metrics(table: BatchedDataDict, k: int) -> dict[str, Any]:
    """``accuracy``, ``pass@k``, ``greedy_accuracy`` and ``avg_length`` of a validation table."""
    greedy = table["greedy"].bool()
    rewards = table["total_reward"].float()
    sampled_rewards = rewards[~greedy]
    prompt_ids = table["prompt_index"][~greedy]
    solved = torch.zeros(int(prompt_ids.max()) + 1, dtype=torch.bool)
    solved.index_put_((prompt_ids,), sampled_rewards > 0, accumulate=True)
    lengths = response_lengths(table).float()
    return {
        "accuracy": float(sampled_rewards.mean()),
        f"pass@{k}": float(solved.float().mean()),
        "greedy_accuracy": float(rewards[greedy].mean()),
        "avg_length": float(lengths[~greedy].mean()),
        "num_prompts": int(greedy.sum()),
    }


def response_lengths(batch: BatchedDataDict) -> torch.Tensor:
    """Generated tokens of each sample (all its assistant turns)."""
    return torch.tensor(
        [
            sum(len(m["token_ids"]) for m in log if m["role"] == "assistant")
            for log in batch["message_log"]
        ],
        dtype=torch.long,
    )
