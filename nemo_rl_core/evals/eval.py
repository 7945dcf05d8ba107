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
from nemo_rl_core.data.config import LOCAL_DATASET, DataConfig, DatasetConfig
from nemo_rl_core.data.datasets.builder import load_rows, task_processors
from nemo_rl_core.data.datasets.local_files import DatasetRowError, map_columns, read_local_rows
from nemo_rl_core.data.datasets.processed_dataset import AllTaskProcessedDataset, rl_collate_fn
from nemo_rl_core.data.interfaces import DatumSpec
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.environments.utils import environment_class
from nemo_rl_core.evals.config import EvalConfig, EvalDataConfig, EvalMasterConfig
from nemo_rl_core.experience.rollouts import calculate_rewards
from nemo_rl_core.models.generation.interfaces import GenerationInterface
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.utils.config import ConfigError, load_config_file
from nemo_rl_core.utils.key_support import check_support

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
    rewards: torch.Tensor, num_tests_per_prompt: int, k: int, answers: list[str | None]
) -> float:
    """NeMo RL's sum of per-prompt cons@k: of every ``k``-subset of a prompt's samples, the
    fraction whose majority answer (the extracted answer most of them give; a tie goes to
    the one met first) is right, i.e. the prompt's first sample giving it has reward 1.
    Divide by the number of prompts for the score."""
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
        total += right / len(subsets)
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


def dataset_entry(data: EvalDataConfig) -> DatasetConfig:
    """The eval dataset as a ``data:`` dataset entry: which environment scores it, its prompt."""
    name, path = (data.dataset_name, None) if data.builtin else (LOCAL_DATASET, data.dataset_name)
    return DatasetConfig(
        dataset_name=name,
        data_path=path,
        num_samples=data.num_samples,
        seed=data.seed,
        prompt_file=data.prompt_file,
        system_prompt_file=data.system_prompt_file,
        env_name=data.env_name,
    )


def eval_rows(data: EvalDataConfig) -> list[dict[str, Any]]:
    """The rows to score, each with its ``problem``, ``expected_answer`` and ``task_name``,
    read through ``problem_key`` and ``solution_key`` (a row without either is refused by
    file, row and key): a built-in generator's rows of ``split`` (default ``validation``,
    the held-out ones GRPO validates on), or a local file's (``split``: a saved dataset's)."""
    entry = dataset_entry(data)
    (task,) = task_processors([entry])
    if data.builtin:
        split = data.split or "validation"
        raw = load_rows(DataConfig.model_validate({split: [entry]}), split)
    else:
        raw = read_local_rows(data.dataset_name, data.split)
    keys = ("data.problem_key", "data.solution_key")
    rows = map_columns(
        raw, data.problem_key, data.solution_key, data.dataset_name, config_keys=keys
    )
    return [{**row, "task_name": task} for row in rows]


def build_eval_dataset(data: EvalDataConfig, tokenizer: Any) -> AllTaskProcessedDataset:
    """The rows as ``DatumSpec``s: the prompt file's template, the tokenizer's chat template."""
    processors = task_processors([dataset_entry(data)])
    spec = next(iter(processors.values()))[0]
    max_length = data.max_input_seq_length or 2**31 - 1
    return AllTaskProcessedDataset(eval_rows(data), tokenizer, spec, processors, max_length)


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
    finally:
        generation.finish_generation()
    batch: BatchedDataDict[Any] = BatchedDataDict.from_batches(answered)
    settings = config.generation
    greedy = settings.temperature == 0 or settings.top_k == 1  # the engines decode greedily
    batch["greedy"] = torch.full((batch.size,), greedy)
    return batch, {"mean_gen_tokens_per_sample": tokens / max(prompts.size, 1)}


def score_answers(
    batch: BatchedDataDict, task_to_env: dict[str, EnvironmentInterface]
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Each answer's reward from its task's environment, with the reason and ground truth
    in ``extra_env_info``."""
    env_return = calculate_rewards(batch, task_to_env)
    batch["total_reward"] = env_return.rewards.to(torch.float32)
    batch["extra_env_info"] = list(env_return.metadata)
    return batch, {"mean_reward": float(batch["total_reward"].mean())}


# ---- before any work -------------------------------------------------------------------


def check_eval_config(config_path: str, overrides: list[str] | None = None) -> EvalMasterConfig:
    """The validated eval config, or ``ConfigError`` naming the key, file or row that cannot
    work: the schema, what this deployment cannot run, the model (a checkpoint path that
    does not exist), the rows (a row without its answer) and the environment that scores
    them. Reads the config and its inputs only; writes nothing."""
    source = f"config {config_path}"
    config = load_config_file(config_path, overrides, EvalMasterConfig)
    check_support(config, source=source)
    for key, name in (
        ("generation.model_name", config.generation.model_name),
        ("tokenizer.name", config.tokenizer.name),
    ):
        try:
            if name is not None:
                resolve_model(name)
        except FileNotFoundError as err:
            raise ConfigError(f"{source}: {key}: {err}") from None
    try:
        rows = eval_rows(config.data)
    except (FileNotFoundError, DatasetRowError, KeyError) as err:
        raise ConfigError(f"{source}: data.dataset_name: {err}") from None
    if not rows:
        raise ConfigError(f"{source}: data.dataset_name={config.data.dataset_name!r} has no rows")
    missing = sorted({row["task_name"] for row in rows} - set(config.env))
    if missing:
        raise ConfigError(
            f"{source}: env.{missing[0]}: the rows are scored by environment {missing[0]!r}, "
            f"which env: does not configure (it has {sorted(config.env)})"
        )
    if config.eval.metric == "cons@k":
        for task in sorted({row["task_name"] for row in rows}):
            if not getattr(environment_class(task), "extracts_answers", False):
                raise ConfigError(
                    f"{source}: eval.metric='cons@k': votes over extracted answers, and "
                    f"environment {task!r} extracts none (the math environment does)"
                )
    return config
