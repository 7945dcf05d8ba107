"""The check of a run's config before anything runs: every mistake that the config, its
model, its environments or its data files show is refused here, in a ``ConfigError`` that
names the key or file, before Prefect or any backend starts and before anything is written.

The checks load neither torch, transformers, vLLM nor Prefect (``tests/flows/
test_config_check.py`` holds them to it), so a mistake is reported within seconds of the
command; only the last one, the optimizer's kwargs against torch's classes, loads torch.
"""

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from nemo_rl_core.algorithms.grpo_config import RolloutMasterConfig, data_setup, load_master_config
from nemo_rl_core.data.config import PreferenceDataConfig
from nemo_rl_core.data.datasets.builder import (
    SPLITS,
    DataSetup,
    load_rows,
    split_datasets,
    task_name,
    task_processors,
)
from nemo_rl_core.models.local_models import ModelNotFoundError, check_model, check_tokenizer
from nemo_rl_core.models.policy.config import TrainedModelConfig
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import check_support


def check_run_config(
    config_class: type[Any],
    config_path: str,
    overrides: list[str] | None,
    setup_for: Callable[[Any], DataSetup] = data_setup,
) -> Any:
    """The validated config of a run, or ``ConfigError`` naming the key, file or row that
    cannot work: its schema, what this machine cannot run (``check_support``), the models,
    the environments the datasets are scored by (RL algorithms), and the data, set up as
    ``setup_for`` (the algorithm's ``data_setup``) says. Writes nothing."""
    config = load_master_config(config_path, overrides, config_class)
    check_support(config, source=f"config {config_path}")
    for section, model in trained_models(config):
        check_model_files(section, model)
    setup = setup_for(config)
    for split in SPLITS:  # reads the prompt files: a missing one fails here, not mid-run
        task_processors(split_datasets(config.data, split, setup), setup)
    if isinstance(config.data, PreferenceDataConfig) and config.data.val_data_paths:
        for named in config.data.validation_sets().values():  # a missing file names its key
            load_rows(named, "validation", setup)  # a bad row fails here, not at validation
    if isinstance(config, RolloutMasterConfig):
        check_dataset_environments(config, setup)
    if not load_rows(config.data, setup=setup):
        raise ConfigError(
            "data.train: no training rows; name a dataset as NeMo RL v0.7's configs do "
            "(data.train.dataset_name, or ResponseDataset with data.train.data_path)"
        )
    for section, model in trained_models(config):  # last: this one loads torch
        model.check_torch_classes(section)
    return config


def trained_models(config: BaseModel) -> list[tuple[str, TrainedModelConfig]]:
    """The config's trained models by section (``policy``, PPO's ``value``)."""
    return [
        (name, section)
        for name in type(config).model_fields
        if isinstance(section := getattr(config, name), TrainedModelConfig)
    ]


def check_model_files(section: str, model: TrainedModelConfig) -> None:
    """The model and its tokenizer resolve to local files (nothing is built or loaded)."""
    named: list[tuple[str, str, Callable[[str], object]]] = [
        ("model_name", model.model_name, check_model)
    ]
    if model.tokenizer.name is not None:
        named.append(("tokenizer.name", model.tokenizer.name, check_tokenizer))
    for key, name, check in named:
        try:
            check(name)
        except ModelNotFoundError as err:
            raise ConfigError(f"{section}.{key}: {err}") from None


def check_dataset_environments(config: RolloutMasterConfig, setup: DataSetup) -> None:
    """Every dataset is scored by an environment of ``env:`` (NeMo RL builds one per
    ``env_name`` from its section), so a misspelled name fails now, not after generation."""
    for split in SPLITS:
        datasets = split_datasets(config.data, split, setup)
        for index, dataset in enumerate(datasets):
            task = task_name(dataset)
            if task in config.env:
                continue
            key = f"data.{split}" + (f".{index}" if len(datasets) > 1 else "") + ".env_name"
            raise ConfigError(
                f"{key}: {task!r} is not an environment of this config's env: section "
                f"(it has {', '.join(sorted(config.env)) or 'none'}); add env.{task} or "
                "name one of those"
            )
