"""Evaluation (NeMo RL's ``nemo_rl.evals.eval``): score any checkpoint on a dataset with
answers, ``num_tests_per_prompt`` samples per prompt, pass@k, cons@k and avg@n.

NeMo RL runs ``run_env_eval`` as one loop; here each step is a function that a stage of the
eval pipeline calls (:data:`nemo_rl_core.pipeline.algorithms.EVAL`), so a rerun of one stage
reads the same stored inputs and writes the same bytes:

    prompts (eval_prompts) -> generate (generate_answers) -> reward (score_answers)
    -> score (eval_metrics)
"""

import itertools
import math
from collections import Counter
from typing import Any, cast

import torch

from nemo_rl_core.algorithms.rollout_generation import generate_one_turn, sampling_seeds
from nemo_rl_core.data.datasets.builder import task_processors
from nemo_rl_core.data.datasets.processed_dataset import AllTaskProcessedDataset, rl_collate_fn
from nemo_rl_core.data.interfaces import UNCAPPED_LENGTH, DatumSpec
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.evals.config import EvalConfig, EvalDataConfig, EvalMasterConfig
from nemo_rl_core.evals.config_check import dataset_entry, eval_rows
from nemo_rl_core.experience.rollouts import calculate_rewards
from nemo_rl_core.models.generation.interfaces import GenerationInterface

MasterConfig = EvalMasterConfig  # NeMo RL's name for the eval YAML's model

# ---- the estimators --------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt (Chen et al. 2021, NeMo RL's ``eval_pass_k``): of
    ``n`` samples ``c`` are correct; the chance that ``k`` drawn without replacement hold at
    least one correct one, ``1 - C(n - c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_pass_k(rewards: torch.Tensor, num_tests_per_prompt: int, k: int) -> float:
    """NeMo RL's sum of per-prompt pass@k over ``rewards`` grouped by prompt (each prompt's
    ``num_tests_per_prompt`` samples in a row); a sample is correct when its reward is
    positive. Divide by the number of prompts for the score."""
    groups = rewards.reshape(-1, num_tests_per_prompt)
    correct = (groups > 0).sum(dim=1).tolist()
    return sum(pass_at_k(num_tests_per_prompt, int(c), k) for c in correct)


def eval_cons_k(
    rewards: torch.Tensor,
    num_tests_per_prompt: int,
    k: int,
    extracted_answers: list[str | None],
) -> float:
    """NeMo RL's sum of per-prompt cons@k: of every ``k``-subset of a prompt's samples, the
    fraction whose majority answer (the extracted answer most of them give; a tie goes to
    the one met first) is right, i.e. the prompt's first sample giving it has reward 1. A
    prompt with fewer than ``k`` samples scores 0. Divide by the number of prompts for the
    score."""
    answers = extracted_answers
    if len(answers) != len(rewards):
        raise ValueError(f"{len(answers)} extracted answers for {len(rewards)} rewards")
    total = 0.0
    for start in range(0, len(answers), num_tests_per_prompt):
        group = answers[start : start + num_tests_per_prompt]
        group_rewards = rewards[start : start + num_tests_per_prompt].tolist()
        right = 0
        subsets = list(itertools.combinations(range(len(group)), k))
        for subset in subsets:
            majority = Counter(group[i] for i in subset).most_common(1)[0][0]
            right += group_rewards[group.index(majority)] == 1.0
        total += right / len(subsets) if subsets else 0.0
    return total


def extracted_answers(batch: BatchedDataDict) -> list[str | None]:
    """Each sample's answer as its environment extracted it (``None``: none found)."""
    return [info.get("extracted_answer") for info in batch["extra_env_info"]]


def eval_metrics(
    rewards: torch.Tensor, settings: EvalConfig, answers: list[str | None] | None = None
) -> dict[str, Any]:
    """``pass@k`` (mean over prompts), ``avg@n`` (the mean reward of all n samples of
    every prompt, n = ``num_tests_per_prompt``) and, with ``metric: cons@k``, ``cons@k``
    from the extracted ``answers``."""
    n, k = settings.num_tests_per_prompt, settings.k_value
    prompts = len(rewards) // n
    scores: dict[str, Any] = {f"pass@{k}": eval_pass_k(rewards, n, k) / prompts}
    if settings.metric == "cons@k":
        if answers is None:
            raise ValueError("cons@k needs the extracted answers of the samples")
        scores[f"cons@{k}"] = eval_cons_k(rewards, n, k, answers) / prompts
    return scores | {
        f"avg@{n}": float(rewards.float().mean()),
        "num_prompts": prompts,
        "num_samples": len(rewards),
    }


# ---- the data --------------------------------------------------------------------------


def build_eval_dataset(data: EvalDataConfig, tokenizer: Any) -> AllTaskProcessedDataset:
    """The rows as ``DatumSpec``s: the prompt file's template, the tokenizer's chat template."""
    processors = task_processors([dataset_entry(data)])
    spec = next(iter(processors.values()))[0]
    max_length = data.max_input_seq_length or UNCAPPED_LENGTH
    return AllTaskProcessedDataset(
        eval_rows(data), tokenizer, spec, processors, max_seq_length=max_length
    )


def eval_prompts(dataset: AllTaskProcessedDataset, settings: EvalConfig) -> BatchedDataDict:
    """Every prompt in order, repeated ``num_tests_per_prompt`` times (``prompt_index``
    names each prompt's group)."""
    # eval rows are prompts: their processors make DatumSpecs, never preference pairs
    batch = rl_collate_fn([cast(DatumSpec, dataset[i]) for i in range(len(dataset))])
    batch["prompt_index"] = torch.arange(batch.size)
    return batch.repeat_interleave(settings.num_tests_per_prompt)


# ---- generation and scoring ------------------------------------------------------------


def generate_answers(
    generation: GenerationInterface, prompts: BatchedDataDict, tokenizer: Any, config: Any
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """One answer per sample, ``generation.num_prompts_per_step`` prompts (all their tests)
    per engine call; sample i is drawn with seed ``eval.seed``'s i-th, so a rerun draws the
    same tokens. ``greedy`` marks answers decoded greedily (temperature 0 or top_k 1)."""
    per_call = config.generation.num_prompts_per_step
    n = config.eval.num_tests_per_prompt
    step = prompts.size if per_call == -1 else per_call * n
    seeds = sampling_seeds(config.eval.seed, 0, prompts.size)
    answered, tokens = [], 0.0
    generation.prepare_for_generation()
    try:
        for start in range(0, prompts.size, step):
            end = min(start + step, prompts.size)
            chunk: BatchedDataDict[Any] = BatchedDataDict(prompts.slice(start, end))
            done, metrics = generate_one_turn(generation, chunk, tokenizer, seeds[start:end])
            answered.append(done)
            tokens += metrics["total_generated_tokens"]
        engine_metrics = generation.take_engine_metrics()
    finally:
        generation.finish_generation()
    batch: BatchedDataDict[Any] = BatchedDataDict.from_batches(answered)
    settings = config.generation
    greedy = settings.temperature == 0 or settings.top_k == 1  # the engines decode greedily
    batch["greedy"] = torch.full((batch.size,), greedy)
    return batch, {"mean_gen_tokens_per_sample": tokens / max(prompts.size, 1), **engine_metrics}


def score_answers(
    batch: BatchedDataDict, task_to_env: dict[str, EnvironmentInterface]
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Each answer's reward from its task's environment, with the reason and ground truth
    in ``extra_env_info``."""
    env_return = calculate_rewards(batch, task_to_env)
    batch["total_reward"] = env_return.rewards.to(torch.float32)
    batch["extra_env_info"] = list(env_return.metadata)
    return batch, {"mean_reward": float(batch["total_reward"].mean())}
