"""NeMo RL's response datasets by name (``nemo_rl.data.datasets.response_datasets``):
``load_response_dataset`` builds one from a dataset's config section."""

from collections.abc import Mapping
from functools import partial
from typing import Any

from nemo_rl_core.data.config import (
    BUILTIN_DATASETS,
    HUB_DATASETS,
    NOT_BUILT_DATASETS,
    unavailable_reason,
)
from nemo_rl_core.data.datasets.generated_dataset import GeneratedDataset, UnavailableDataset
from nemo_rl_core.data.datasets.response_datasets.oai_format_dataset import (
    OpenAIFormatDataset,
    PreservingDataset,
)
from nemo_rl_core.data.datasets.response_datasets.response_dataset import ResponseDataset
from nemo_rl_core.data.datasets.utils import dataset_class

_RESPONSE_BUILTINS = tuple(name for name in BUILTIN_DATASETS if name != "addition_preference")

DATASET_REGISTRY: dict[str, Any] = {
    "ResponseDataset": ResponseDataset,
    "openai_format": OpenAIFormatDataset,
    **dict.fromkeys(_RESPONSE_BUILTINS, GeneratedDataset),
    **{
        name: partial(UnavailableDataset, reason=unavailable_reason(name))
        for name in (*HUB_DATASETS, *NOT_BUILT_DATASETS)
    },
}


def load_response_dataset(data_config: Mapping[str, Any]) -> Any:
    """The dataset ``data_config["dataset_name"]`` names, built from the whole section, its
    prompt spec and processor bound."""
    cls = dataset_class(DATASET_REGISTRY, data_config["dataset_name"], "'ResponseDataset'")
    dataset = cls(**data_config)
    dataset.set_task_spec(data_config)
    dataset.set_processor()
    return dataset


__all__ = [
    "DATASET_REGISTRY",
    "GeneratedDataset",
    "OpenAIFormatDataset",
    "PreservingDataset",
    "ResponseDataset",
    "load_response_dataset",
]
