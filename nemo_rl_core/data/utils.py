"""NeMo RL's data setup for hand-written loops (``nemo_rl.data.utils``): the train and
validation datasets of a ``data:`` section, and the environments that score them.

They build exactly what a flow builds from the same section (``datasets.builder``), so a
ported script and a flow train on the same datums: the section is validated first (a
misspelt key is refused by name), and each row's ``task_name`` is the environment that
scores it.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nemo_rl_core.data.config import PREFERENCE_PROCESSOR, SPLITS, DataConfig, PreferenceDataConfig
from nemo_rl_core.data.datasets.builder import DataSetup, build_dataset, dataset_environments
from nemo_rl_core.utils.checkpoint_manager import CONFIG_FILE

if TYPE_CHECKING:
    from nemo_rl_core.data.datasets.processed_dataset import AllTaskProcessedDataset
    from nemo_rl_core.environments.interfaces import EnvironmentInterface

DATALOADER_STATE = "train_dataloader{suffix}.pt"
Section = TypeVar("Section", bound=DataConfig)


def _data_config(data_config: DataConfig | Mapping[str, Any], schema: type[Section]) -> Section:
    """The section validated as ``schema`` (a misspelt key refused by name)."""
    if isinstance(data_config, schema):
        return data_config
    if isinstance(data_config, DataConfig):
        data_config = data_config.model_dump(exclude_unset=True)
    if "train" not in data_config:
        raise ValueError(
            "data.train is missing: NeMo RL v0.7 names each split's datasets under data.train "
            "and data.validation (one mapping or a list), filled from data.default"
        )
    return schema.model_validate(dict(data_config))


def _split_datasets(
    config: DataConfig, tokenizer: Any, setup: DataSetup
) -> dict[str, "AllTaskProcessedDataset | None"]:
    built: dict[str, AllTaskProcessedDataset | None] = {}
    for split in SPLITS:
        dataset = build_dataset(config, tokenizer, split, setup)
        built[split] = dataset if len(dataset) > 0 or split == "train" else None
    return built


def setup_response_data(
    tokenizer: Any,
    data_config: DataConfig | Mapping[str, Any],
    env_configs: Mapping[str, Any] | None = None,
    is_vlm: bool = False,
) -> tuple[Any, ...]:
    """(train, validation) datasets of prompts; with ``env_configs`` also each task's
    environment for training and for validation. Validation is None when the section
    names no validation rows (neither ``data.validation`` nor ``split_validation_size``)."""
    if is_vlm:
        raise ValueError("is_vlm=True: this project trains text-only models")
    config = _data_config(data_config, DataConfig)
    setup = DataSetup(env=env_configs)
    built = _split_datasets(config, tokenizer, setup)
    train, validation = built["train"], built["validation"]
    if env_configs is None:
        return train, validation
    envs = _environments(config, env_configs)
    return train, validation, _task_envs(train, envs), _task_envs(validation, envs)


def setup_preference_data(
    tokenizer: Any, data_config: PreferenceDataConfig | Mapping[str, Any]
) -> tuple["AllTaskProcessedDataset", dict[str, "AllTaskProcessedDataset"]]:
    """The training pairs, and the validation pairs by name: each of ``val_data_paths``, else
    ``default`` (data.validation's, or the rows ``split_validation_size`` sets aside), as
    DPO and reward models take them."""
    config = _data_config(data_config, PreferenceDataConfig)
    setup = DataSetup(default_processor=PREFERENCE_PROCESSOR)
    validation = {
        name: build_dataset(sets, tokenizer, "validation", setup)
        for name, sets in config.validation_sets().items()
    }
    train = build_dataset(config, tokenizer, "train", setup)
    return train, {name: pairs for name, pairs in validation.items() if len(pairs) > 0}


def _environments(
    config: DataConfig, env_configs: Mapping[str, Any]
) -> dict[str, "EnvironmentInterface"]:
    from nemo_rl_core.environments.utils import create_env

    envs = {}
    for name in sorted(dataset_environments(config, env_configs)):
        if name not in env_configs:
            raise ValueError(
                f"env.{name}: the datasets are scored by environment {name!r}, and env_configs "
                f"has no such section (it has {sorted(env_configs)})"
            )
        envs[name] = create_env(name, env_configs[name])
    return envs


def _task_envs(
    dataset: "AllTaskProcessedDataset | None", envs: Mapping[str, "EnvironmentInterface"]
) -> dict[str, "EnvironmentInterface"]:
    if dataset is None or not isinstance(dataset.task_data_processors, dict):
        return {}
    return {task: envs[task] for task in dataset.task_data_processors}


def get_train_dataset_name(data_config: Mapping[str, Any] | None) -> str | None:
    """The training dataset's ``dataset_name`` (``data.train`` as one mapping or a list of
    them: the first), or None where the section does not say one."""
    train = (data_config or {}).get("train")
    if isinstance(train, list):
        train = train[0] if train else None
    return train.get("dataset_name") if isinstance(train, Mapping) else None


def load_dataloader_state(
    dataloader: Any, checkpoint_path: str, data_config: Mapping[str, Any], suffix: str = ""
) -> None:
    """Restore a dataloader's position from a checkpoint, unless the checkpoint trained on
    another dataset (its ``config.yaml`` names it): then the new dataset starts at its first
    batch, instead of skipping rows it never served."""
    import torch
    import yaml

    folder = Path(checkpoint_path)
    state = torch.load(folder / DATALOADER_STATE.format(suffix=suffix), weights_only=False)
    saved_config = folder / CONFIG_FILE
    if saved_config.exists():
        saved = yaml.safe_load(saved_config.read_text()) or {}
        before, now = get_train_dataset_name(saved.get("data")), get_train_dataset_name(data_config)
        if before is not None and now is not None and before != now:
            print(f"dataset changed from {before!r} to {now!r}: the dataloader starts afresh")
            return
    dataloader.load_state_dict(state)
