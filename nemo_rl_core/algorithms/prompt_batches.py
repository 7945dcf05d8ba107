"""The prompts of each step of an algorithm that generates (GRPO, PPO, distillation): the
training dataloader, and one generation batch taken after a stored dataloader state."""

from typing import Any

import torch

from nemo_rl_core.algorithms.grpo_config import (
    RLMasterConfig,
    RolloutLoopConfig,
    RolloutScheduleConfig,
    data_setup,
)
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import build_dataset
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def prompts_per_batch(loop: RolloutScheduleConfig) -> int:
    """Prompts per generation batch: ``num_prompts_per_step``, times ``batch_multiplier``
    under dynamic sampling (as NeMo RL sizes its dataloader; distillation has none)."""
    if isinstance(loop, RolloutLoopConfig) and loop.use_dynamic_sampling:
        return int(loop.num_prompts_per_step * loop.batch_multiplier)
    return loop.num_prompts_per_step


def make_dataloader(config: RLMasterConfig, tokenizer: Any) -> StatefulDataLoader:
    """The training dataloader: one generation batch of prompts per call, shuffled from the
    algorithm's seed as NeMo RL's is; the last partial batch of an epoch is dropped."""
    return StatefulDataLoader(
        build_dataset(config.data, tokenizer, setup=data_setup(config)),
        batch_size=prompts_per_batch(config.algorithm),
        shuffle=config.data.shuffle,
        seed=config.algorithm.seed,
        drop_last=True,
    )


def take_prompts(
    dataloader: StatefulDataLoader,
    config: RLMasterConfig,
    dataloader_state: dict,
    first_prompt_index: int = 0,
) -> tuple[BatchedDataDict, dict]:
    """The prompts after ``dataloader_state``, each repeated ``num_generations_per_prompt``
    times (``prompt_index`` names each group, from ``first_prompt_index``), and the
    dataloader state after taking them."""
    dataloader.load_state_dict(dataloader_state)
    batch = dataloader.next_batch()
    generations = config.algorithm.num_generations_per_prompt
    repeated = batch.repeat_interleave(generations)
    indices = torch.arange(first_prompt_index, first_prompt_index + batch.size)
    repeated["prompt_index"] = indices.repeat_interleave(generations)
    return repeated, dataloader.state_dict()
