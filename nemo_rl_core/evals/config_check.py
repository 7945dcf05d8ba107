"""What an eval run reads before any work: the rows it scores and the check of its config,
without torch (``python -m flows eval`` refuses a mistake in seconds; the scoring itself is
:mod:`nemo_rl_core.evals.eval`'s).
"""

from typing import Any

from nemo_rl_core.data.config import LOCAL_DATASET, DataConfig, DatasetConfig
from nemo_rl_core.data.datasets.builder import load_rows, task_processors
from nemo_rl_core.data.datasets.local_files import DatasetRowError, map_columns, read_local_rows
from nemo_rl_core.environments.utils import environment_class
from nemo_rl_core.evals.config import EvalDataConfig, EvalMasterConfig
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.utils.config import ConfigError, load_config_file
from nemo_rl_core.utils.key_support import check_support


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
