"""NeMo RL's dataset helpers (``nemo_rl.data.datasets.utils``): load a local dataset, split
off validation rows, resolve a user's dataset class, fill a dataset's keys from ``default``.

The split is Hugging Face's ``train_test_split`` (which NeMo RL's datasets call) reproduced
on indices, so the flows, which hold plain rows, hold out the same rows as NeMo RL does for
the same seed. Hugging Face ``datasets`` and torch load only inside the functions that need
them: the config check imports this module.
"""

import importlib
import math
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nemo_rl_core.data.config import BUILTIN_DATASETS
from nemo_rl_core.data.datasets.local_files import read_local_rows

HUB_REFUSAL = (
    "is not a local file or folder, and this deployment downloads nothing from the Hugging "
    "Face hub; give a local JSONL/JSON, Parquet, CSV, Arrow or text file, or a save_to_disk folder"
)


def train_validation_indices(
    count: int, test_size: float, seed: int
) -> tuple[list[int], list[int]]:
    """(train, validation) row indices of ``count`` rows as ``Dataset.train_test_split``
    draws them: ``test_size`` below 1 is a share (rounded up), 1 or more a row count."""
    held = math.ceil(test_size * count) if test_size < 1 else int(test_size)
    if held >= count:
        raise ValueError(
            f"split_validation_size={test_size:g} holds out {held} of the {count} rows: "
            "leave some to train on"
        )
    order = np.random.default_rng(seed).permutation(count)
    return [int(i) for i in order[held:]], [int(i) for i in order[:held]]


def local_dataset_rows(
    data_path: str, subset: str | None = None, split: str | None = None
) -> list[dict[str, Any]]:
    """The rows of a local file or ``save_to_disk`` folder. NeMo RL also downloads hub
    datasets by name (a ``subset`` picks one's configuration); here either is refused,
    saying so."""
    if not Path(data_path).expanduser().exists():
        raise FileNotFoundError(f"data_path {data_path!r} {HUB_REFUSAL}")
    if subset is not None:
        raise ValueError(
            f"subset={subset!r} selects a configuration of a hub dataset; "
            f"{data_path!r} is a local file"
        )
    return read_local_rows(data_path, split)


def load_dataset_from_path(
    data_path: str, data_subset: str | None = None, data_split: str | None = "train"
) -> Any:
    """A local file or ``save_to_disk`` folder as a Hugging Face ``Dataset``."""
    from datasets import Dataset

    return Dataset.from_list(local_dataset_rows(data_path, data_subset, data_split))


def resolve_external_dataset_class(dataset_name: str) -> type:
    """The class a dotted ``dataset_name`` (``my_pkg.my_module.MyDataset``) names, so users
    plug their own datasets in without editing the registry."""
    module_path, _, class_name = dataset_name.rpartition(".")
    try:
        module = importlib.import_module(module_path)
    except ImportError as err:
        raise ValueError(
            f"Could not import module {module_path!r} for dataset_name={dataset_name!r}; "
            "install it or put it on PYTHONPATH"
        ) from err
    if not hasattr(module, class_name):
        raise ValueError(
            f"Module {module_path!r} has no attribute {class_name!r} "
            f"(dataset_name={dataset_name!r})"
        )
    found = getattr(module, class_name)
    if not isinstance(found, type):
        raise ValueError(
            f"dataset_name={dataset_name!r} resolved to {found!r}, which is not a class; "
            "name a dataset class"
        )
    return found


def dataset_class(registry: Mapping[str, Any], dataset_name: str, local_names: str) -> Any:
    """The class ``dataset_name`` means: a registered name, else a dotted import path to the
    user's own class."""
    if dataset_name in registry:
        return registry[dataset_name]
    if "." in dataset_name:
        return resolve_external_dataset_class(dataset_name)
    raise ValueError(
        f"Unsupported dataset_name={dataset_name!r}; use a built-in name "
        f"({', '.join(sorted(n for n in registry if n in BUILTIN_DATASETS))}), {local_names} "
        "with data_path, or a dotted import path to your own dataset class"
    )


def update_single_dataset_config(
    data_config: MutableMapping[str, Any], default_data_config: Mapping[str, Any]
) -> None:
    """Fill the keys a dataset's section does not set from ``default`` (in place)."""
    for key, value in default_data_config.items():
        data_config.setdefault(key, value)


def merge_datasets(datasets: Sequence[Any]) -> Any:
    """One map-style dataset of several: Hugging Face's concatenation when all are Hugging
    Face datasets, else torch's ``ConcatDataset`` (``len`` and integer indexing)."""
    if not datasets:
        raise ValueError("merge_datasets needs at least one dataset")
    if len(datasets) == 1:
        return datasets[0]
    from datasets import Dataset, concatenate_datasets

    if all(isinstance(dataset, Dataset) for dataset in datasets):
        return concatenate_datasets(list(datasets))
    from torch.utils.data import ConcatDataset

    return ConcatDataset(datasets)


def extract_necessary_env_names(data_config: Mapping[str, Any]) -> list[str]:
    """The environments the datasets of ``data:`` name (``env_name`` of ``train``,
    ``validation`` and ``default``, each a mapping or a list of them), without repeats."""
    names: list[str] = []
    for key in ("train", "validation", "default"):
        section = data_config.get(key)
        entries = section if isinstance(section, list) else [section]
        for entry in entries:
            name = entry.get("env_name") if isinstance(entry, Mapping) else None
            if name is not None and name not in names:
                names.append(name)
    return names


def assert_no_double_bos(token_ids: Any, tokenizer: Any) -> None:
    """Refuse a first message that starts with two BOS tokens (a chat template that adds
    one, and a processor that adds another): the model would train on a sequence it never
    sees at inference."""
    inner = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    bos = getattr(inner, "bos_token_id", None)
    ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
    if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        raise AssertionError("Found double BOS token in the first two positions of the message.")
