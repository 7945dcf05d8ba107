"""NeMo RL's preference datasets by name (``nemo_rl.data.datasets.preference_datasets``):
``load_preference_dataset`` builds one from a dataset's config section."""

from collections.abc import Mapping
from functools import partial
from typing import Any

from nemo_rl_core.data.config import unavailable_reason
from nemo_rl_core.data.datasets.generated_dataset import GeneratedDataset, UnavailableDataset
from nemo_rl_core.data.datasets.preference_datasets.preference_dataset import (
    BinaryPreferenceDataset,
    PreferenceDataset,
)
from nemo_rl_core.data.datasets.utils import dataset_class

DATASET_REGISTRY: dict[str, Any] = {
    "PreferenceDataset": PreferenceDataset,
    "BinaryPreferenceDataset": BinaryPreferenceDataset,
    "addition_preference": GeneratedDataset,
    **{
        name: partial(UnavailableDataset, reason=unavailable_reason(name))
        for name in ("HelpSteer3", "Tulu3Preference")
    },
}


def load_preference_dataset(data_config: Mapping[str, Any]) -> Any:
    """The dataset ``data_config["dataset_name"]`` names, built from the whole section, its
    prompt spec bound (preference rows all go through ``preference_preprocessor``)."""
    cls = dataset_class(
        DATASET_REGISTRY,
        data_config["dataset_name"],
        "'BinaryPreferenceDataset' or 'PreferenceDataset'",
    )
    dataset = cls(**data_config)
    dataset.set_task_spec(data_config)
    return dataset


__all__ = [
    "DATASET_REGISTRY",
    "BinaryPreferenceDataset",
    "PreferenceDataset",
    "load_preference_dataset",
]
