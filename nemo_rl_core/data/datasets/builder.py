"""``data:`` -> datasets of ``DatumSpec``s: the one place that knows which rows, environment
and processor each dataset of a split means.

GRPO's use::

    dataset = build_dataset(config, tokenizer)                   # train split
    loader = StatefulDataLoader(dataset, num_prompts_per_step, shuffle=config.data.shuffle,
                                seed=config.grpo.seed)
"""

import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from nemo_rl_core.data.config import (
    BINARY_PREFERENCE_DATASET,
    LOCAL_DATASETS,
    OPENAI_DATASET,
    PREFERENCE_DATASET,
    PREFERENCE_PROCESSOR,
    PUZZLE_ENV,
    SFT_PROCESSOR,
    SPLITS,
    DataConfig,
    DatasetConfig,
    games_from_environment,
    is_class_path,
    task_name,
    unavailable_reason,
)
from nemo_rl_core.data.datasets.generators import (
    addition_demonstrations,
    addition_preferences,
    addition_problems,
    arithmetic_word_problems,
    countdown_puzzles,
    sliding_puzzle_games,
)
from nemo_rl_core.data.datasets.local_files import (
    map_columns,
    openai_rows,
    preference_rows,
    read_local_rows,
)
from nemo_rl_core.data.datasets.utils import (
    resolve_external_dataset_class,
    train_validation_indices,
)
from nemo_rl_core.data.interfaces import UNCAPPED_LENGTH, TaskDataProcessFnCallable, TaskDataSpec
from nemo_rl_core.data.processors import PROCESSOR_REGISTRY, math_data_processor, sft_processor

if TYPE_CHECKING:  # it loads torch; the config check reads rows and prompt files without it
    from nemo_rl_core.data.datasets.processed_dataset import AllTaskProcessedDataset

DEFAULT_PROCESSORS = {
    "sliding_puzzle": "sliding_puzzle_data_processor",
    "addition_sft": SFT_PROCESSOR,
    "addition_answer_line_sft": SFT_PROCESSOR,
    OPENAI_DATASET: SFT_PROCESSOR,
    "addition_preference": PREFERENCE_PROCESSOR,
    PREFERENCE_DATASET: PREFERENCE_PROCESSOR,
    BINARY_PREFERENCE_DATASET: PREFERENCE_PROCESSOR,
}
# The preference fields a BinaryPreferenceDataset row holds unless data.*_key renames them.
BINARY_DEFAULT_KEYS = ("prompt", "chosen", "rejected")
# NeMo RL's math_hf_data_processor (also its "default") reads rows its dataset classes
# format as chat messages; rows here are normalized to problem/answer, which
# math_data_processor turns into the same datum (the prompt-formatted question as one user
# turn, the answer as ground truth). Every other name means NeMo RL's processor of that name.
NORMALIZED_ROW_PROCESSORS: dict[str, TaskDataProcessFnCallable] = {
    "default": math_data_processor,
    "math_hf_data_processor": math_data_processor,
}
# rows a built-in generator draws when its dataset sets no num_samples
DEFAULT_COUNTS = {"train": 1024, "validation": 64}
VALIDATION_SEED_OFFSET = 1_000_003  # a generator's validation rows come from another seed


class DataSetup:
    """What the datasets of a run depend on beyond ``data:``: the sliding-puzzle environment's
    game settings, how many games NeMo RL's puzzle runner draws per split, the policy's
    sequence length, the processor of a dataset that names none (NeMo RL's ``default``;
    SFT's ``sft_processor``) and the options ``sft_processor`` is bound to (``data.add_bos`` and friends)."""

    def __init__(
        self,
        env: Mapping[str, Any] | None = None,
        puzzle_counts: Mapping[str, int] | None = None,
        max_seq_length: int = UNCAPPED_LENGTH,
        default_processor: str = "default",
        sft_options: Mapping[str, bool] | None = None,
    ) -> None:
        self.env = dict(env or {})
        self.puzzle_counts = {**DEFAULT_COUNTS, **(puzzle_counts or {})}
        self.max_seq_length = max_seq_length  # when data.max_input_seq_length is null
        self.default_processor = default_processor
        self.sft_options: dict[str, Any] = dict(sft_options or {})

    def puzzle_settings(self) -> dict[str, Any]:
        entry = self.env.get(PUZZLE_ENV) or {}
        settings = entry.get("cfg", entry) if isinstance(entry, Mapping) else {}
        game = dict(settings.get("game_config") or {})
        return {
            "size": int(game.get("size", 3)),
            "shuffle_moves": int(game.get("shuffle_moves", 10)),
            "max_moves": int(settings.get("max_moves", 50)),
        }


def split_datasets(config: DataConfig, split: str, setup: DataSetup) -> list[DatasetConfig]:
    """The datasets of ``split``: the generated puzzle games where the environment sets
    them up (:func:`games_from_environment`), else those ``data:`` names."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if games_from_environment(config, setup.env):
        return [DatasetConfig(dataset_name="sliding_puzzle")]
    return config.datasets(split)


def _generated_rows(dataset: DatasetConfig, split: str, setup: DataSetup) -> list[dict[str, Any]]:
    seed = dataset.seed + (VALIDATION_SEED_OFFSET if split == "validation" else 0)
    if dataset.dataset_name == "arithmetic":
        return arithmetic_word_problems(dataset.num_samples or DEFAULT_COUNTS[split], seed)
    additions: dict[str, Callable[..., list[dict[str, Any]]]] = {
        "addition": addition_problems,
        "addition_sft": addition_demonstrations,
        "addition_answer_line": partial(addition_problems, answer_format="answer_line"),
        "addition_answer_line_sft": partial(addition_demonstrations, answer_format="answer_line"),
        "addition_preference": addition_preferences,
    }
    if dataset.dataset_name in additions:
        count = dataset.num_samples or DEFAULT_COUNTS[split]
        return additions[dataset.dataset_name](count, seed, held_out=split == "validation")
    if dataset.dataset_name == "countdown":
        return countdown_puzzles(dataset.num_samples or DEFAULT_COUNTS[split], seed)
    if dataset.dataset_name != "sliding_puzzle":
        # Config checks refuse these first; a script's setup_response_data gets here too.
        why = unavailable_reason(dataset.dataset_name) or "no built-in generator and no data_path"
        raise ValueError(f"dataset_name {dataset.dataset_name!r}: {why}")
    count = dataset.num_samples or setup.puzzle_counts[split]
    return _puzzle_rows(count, seed, setup.puzzle_settings())


def _puzzle_rows(count: int, seed: int, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Games of random size (2 up to ``size``) and an odd number of shuffle moves (1 up to
    ``shuffle_moves``), as NeMo RL's puzzle runner draws them; game i from ``seed + i``."""
    rows = []
    for index in range(count):
        rng = random.Random(seed + index)
        moves = rng.randint(1, max(settings["shuffle_moves"], 1)) | 1
        size = rng.randint(2, max(settings["size"], 2))
        rows += sliding_puzzle_games(1, seed + index, size, moves, settings["max_moves"])
    return rows


def dataset_rows(dataset: DatasetConfig, split: str, setup: DataSetup) -> list[dict[str, Any]]:
    """The rows of one dataset for ``split`` (generated, read, or a user's class), each
    ``repeat`` times."""
    if is_custom(dataset):
        return _repeated(_custom_rows(dataset), dataset)
    if dataset.dataset_name not in LOCAL_DATASETS and dataset.data_path is None:
        return _repeated(_generated_rows(dataset, split, setup), dataset)
    assert dataset.data_path is not None  # DatasetConfig requires it for local datasets
    raw = read_local_rows(dataset.data_path, dataset.split)
    processor = processor_name(dataset, setup)
    if dataset.dataset_name == OPENAI_DATASET:
        rows = openai_rows(
            raw,
            dataset.data_path,
            dataset.chat_key,
            dataset.system_key,
            dataset.system_prompt,
            dataset.tool_key,
        )
    elif processor == PREFERENCE_PROCESSOR:
        rows = preference_rows(raw, dataset.data_path, binary_preference_keys(dataset))
    else:
        rows = map_columns(
            raw,
            dataset.input_key,
            dataset.output_key,
            source=dataset.data_path,
            chat_rows=processor == SFT_PROCESSOR,
        )
    return _repeated(rows, dataset)


def _custom_rows(dataset: DatasetConfig) -> list[dict[str, Any]]:
    """The rows of a user's dataset class (NeMo RL's dotted ``dataset_name``), built from
    the section as NeMo RL builds it. The run holds out ``split_validation_size`` and
    repeats rows itself, so the class gets neither; its prompt and processor are the run's
    (:func:`task_processors`)."""
    assert dataset.dataset_name is not None  # is_custom
    section = dataset.model_dump(exclude_unset=True, exclude={"split_validation_size", "repeat"})
    loaded = resolve_external_dataset_class(dataset.dataset_name)(**section)
    return [dict(row) for row in loaded.dataset]


def _repeated(rows: list[dict[str, Any]], dataset: DatasetConfig) -> list[dict[str, Any]]:
    return [row for row in rows for _ in range(dataset.repeat)]


def is_custom(dataset: DatasetConfig) -> bool:
    """Whether the dataset is a user's class, named by its dotted import path."""
    return is_class_path(dataset.dataset_name)


def binary_preference_keys(dataset: DatasetConfig) -> tuple[str, str, str] | None:
    """The prompt, chosen and rejected columns of a ``BinaryPreferenceDataset``; None for
    rows already in NeMo RL's ``PreferenceDataset`` format."""
    if dataset.dataset_name != BINARY_PREFERENCE_DATASET:
        return None
    written = (dataset.prompt_key, dataset.chosen_key, dataset.rejected_key)
    prompt, chosen, rejected = (
        key or default for key, default in zip(written, BINARY_DEFAULT_KEYS, strict=True)
    )
    return prompt, chosen, rejected


def _carve(
    rows: list[dict[str, Any]], dataset: DatasetConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, validation) rows of a dataset with ``split_validation_size``: the rows NeMo
    RL's ``train_test_split`` holds out for the same seed."""
    size = dataset.split_validation_size
    if size <= 0:
        return rows, []
    try:
        train, held = train_validation_indices(len(rows), size, dataset.seed)
    except ValueError as err:
        raise ValueError(f"{dataset.dataset_name or dataset.data_path!r}: {err}") from None
    return [rows[i] for i in train], [rows[i] for i in held]


def dataset_environments(config: DataConfig, env: Mapping[str, Any]) -> set[str]:
    """The environments that score the datasets of every split (NeMo RL's
    ``extract_necessary_env_names``), the puzzle games that ``env`` alone sets up included."""
    setup = DataSetup(env=env)
    return {task_name(d) for split in SPLITS for d in split_datasets(config, split, setup)}


def _carved_validation(config: DataConfig, split: str, setup: DataSetup) -> bool:
    """Validation rows come out of the training datasets (``split_validation_size``)."""
    if split != "validation" or games_from_environment(config, setup.env):
        return False
    return config.validation is None and config.train is not None


def load_rows(
    config: DataConfig, split: str = "train", setup: DataSetup | None = None
) -> list[dict[str, Any]]:
    """The normalized rows of ``split``, each tagged with its dataset's ``task_name``.

    Validation rows come from ``data.validation``; without it, from the share of each
    training dataset that ``split_validation_size`` sets aside (and training loses them)."""
    setup = setup or DataSetup()
    rows: list[dict[str, Any]] = []
    if _carved_validation(config, split, setup):
        for dataset in split_datasets(config, "train", setup):
            held = _carve(dataset_rows(dataset, "train", setup), dataset)[1]
            rows += [{**row, "task_name": task_name(dataset)} for row in held]
        return rows
    for dataset in split_datasets(config, split, setup):
        own = dataset_rows(dataset, split, setup)
        if split == "train":
            own = _carve(own, dataset)[0]
        rows += [{**row, "task_name": task_name(dataset)} for row in own]
    return rows


def processor_name(dataset: DatasetConfig, setup: DataSetup | None = None) -> str:
    """The processor of a dataset: its own, its built-in's, else the run's default."""
    default = (setup or DataSetup()).default_processor
    return dataset.processor or DEFAULT_PROCESSORS.get(dataset.dataset_name or "", default)


def task_processors(
    datasets: list[DatasetConfig], setup: DataSetup | None = None
) -> dict[str, tuple[TaskDataSpec, TaskDataProcessFnCallable]]:
    """Each environment's prompt spec (its prompt files read now) and processor
    (``sft_processor`` bound to the run's ``sft_options``)."""
    setup = setup or DataSetup()
    named: dict[str, tuple[TaskDataSpec, str, bool]] = {}
    for dataset in datasets:
        task = task_name(dataset)
        spec = TaskDataSpec(
            task_name=task,
            prompt_file=dataset.prompt_file,
            system_prompt_file=dataset.system_prompt_file,
        )
        entry = (spec, processor_name(dataset, setup), is_custom(dataset))
        if named.get(task, entry) != entry:
            raise ValueError(
                f"two datasets score with environment {task!r} but differ in prompt or "
                "processor; give them distinct env_name entries"
            )
        named[task] = entry
    return {
        task: (spec, bound_processor(name, setup, nemo_rl_rows=custom))
        for task, (spec, name, custom) in named.items()
    }


def bound_processor(
    name: str, setup: DataSetup, nemo_rl_rows: bool = False
) -> TaskDataProcessFnCallable:
    """The processor ``name`` means for rows built here (``sft_processor`` bound to the
    run's options), or, for ``nemo_rl_rows`` (a user's dataset class), NeMo RL's own."""
    if name == SFT_PROCESSOR and setup.sft_options:
        return partial(sft_processor, **setup.sft_options)
    if nemo_rl_rows:
        return PROCESSOR_REGISTRY[name]
    return NORMALIZED_ROW_PROCESSORS.get(name) or PROCESSOR_REGISTRY[name]


def build_dataset(
    config: DataConfig, tokenizer: Any, split: str = "train", setup: DataSetup | None = None
) -> "AllTaskProcessedDataset":
    """Rows of ``split`` as a dataset of ``DatumSpec``s templated with ``tokenizer``, each
    row processed by its own dataset's processor and prompt."""
    from nemo_rl_core.data.datasets.processed_dataset import AllTaskProcessedDataset

    setup = setup or DataSetup()
    source = "train" if _carved_validation(config, split, setup) else split
    datasets = split_datasets(config, source, setup)
    processors = task_processors(datasets, setup)
    default_spec = next(iter(processors.values()))[0] if processors else TaskDataSpec()
    return AllTaskProcessedDataset(
        load_rows(config, split, setup),
        tokenizer,
        default_spec,
        processors,
        max_seq_length=config.max_input_seq_length or setup.max_seq_length,
    )
