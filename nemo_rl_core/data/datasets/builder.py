"""``DataConfig`` -> dataset of ``DatumSpec``s: the one place that knows which rows and
processor each ``dataset_name`` means.

GRPO's use::

    dataset = build_dataset(config.data, tokenizer)              # train split
    loader = StatefulDataLoader(dataset, num_prompts_per_step, shuffle=config.data.shuffle,
                                seed=config.data.seed)
    batch = loader.next_batch().repeat_interleave(num_generations_per_prompt)
    batch, metrics = run_multi_turn_rollout(generation, batch, tokenizer, task_to_env, ...)
    train_data = message_logs_to_train_data(batch["message_log"], tokenizer.pad_token_id)
"""

from typing import Any

from nemo_rl_core.data.config import LOCAL_DATASET, DataConfig
from nemo_rl_core.data.datasets.generators import (
    arithmetic_word_problems,
    countdown_puzzles,
    sliding_puzzle_games,
)
from nemo_rl_core.data.datasets.local_files import map_columns, read_local_rows
from nemo_rl_core.data.datasets.processed_dataset import AllTaskProcessedDataset
from nemo_rl_core.data.interfaces import TaskDataSpec
from nemo_rl_core.data.processors import math_data_processor, sliding_puzzle_data_processor

# dataset_name -> the environment (task_name) its rows are scored by
DEFAULT_TASKS = {
    "arithmetic": "math",
    "countdown": "countdown",
    LOCAL_DATASET: "math",
    "sliding_puzzle": "sliding_puzzle_game",
}


def load_rows(config: DataConfig, split: str = "train") -> list[dict[str, Any]]:
    """The normalized rows of ``split`` (``train`` or ``validation``)."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    validation = split == "validation"
    # validation rows of a generator come from a different seed than training rows
    seed = config.seed + (1_000_003 if validation else 0)
    count = config.val_num_samples if validation else config.num_samples
    if config.dataset_name == "arithmetic":
        return arithmetic_word_problems(count, seed)
    if config.dataset_name == "countdown":
        return countdown_puzzles(count, seed)
    if config.dataset_name == "sliding_puzzle":
        return sliding_puzzle_games(
            count, seed, config.puzzle_size, config.puzzle_shuffle_moves, config.puzzle_max_moves
        )
    path = config.val_data_path if validation else config.train_data_path
    if path is None:
        return []
    rows = read_local_rows(path, config.split)
    return map_columns(rows, config.input_key, config.output_key, source=str(path))


def build_dataset(
    config: DataConfig, tokenizer: Any, split: str = "train"
) -> AllTaskProcessedDataset:
    """Rows of ``split`` as a dataset of ``DatumSpec``s templated with ``tokenizer``."""
    task_name = config.env_name or DEFAULT_TASKS[config.dataset_name]
    spec = TaskDataSpec(
        task_name=task_name,
        prompt_file=config.prompt_file,
        system_prompt_file=config.system_prompt_file,
    )
    processor = (
        sliding_puzzle_data_processor
        if config.dataset_name == "sliding_puzzle"
        else math_data_processor
    )
    return AllTaskProcessedDataset(
        load_rows(config, split), tokenizer, spec, processor, config.max_input_seq_length
    )
