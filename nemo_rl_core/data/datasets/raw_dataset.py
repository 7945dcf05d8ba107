"""NeMo RL's ``RawDataset``: the rows of one dataset, before any tokenization, with the
task name, prompt spec and processor its rows are turned into datums with.

``load_response_dataset`` and ``load_preference_dataset`` build one from a dataset's config
section, for a script that drives its own loop.
"""

from collections.abc import Mapping
from typing import Any

from nemo_rl_core.data.datasets.utils import train_validation_indices
from nemo_rl_core.data.interfaces import (
    TaskDataPreProcessFnCallable,
    TaskDataProcessFnCallable,
    TaskDataSpec,
)
from nemo_rl_core.data.processors import PROCESSOR_REGISTRY


class RawDataset:
    """Rows (a Hugging Face ``Dataset``) of one task; ``val_dataset`` holds the rows set
    aside for validation when the dataset serves both (``split_validation_size``)."""

    data_config: Mapping[str, Any]
    dataset: Any
    val_dataset: Any = None
    task_name: str
    task_spec: TaskDataSpec
    processor: TaskDataProcessFnCallable
    preprocessor: TaskDataPreProcessFnCallable | None = None

    def split_train_validation(self, test_size: float, seed: int) -> None:
        """Hold out ``test_size`` rows (a share below 1, a count from 1) as NeMo RL's
        ``train_test_split`` picks them for ``seed``; 0 holds out nothing."""
        if test_size <= 0:
            return
        train, held = train_validation_indices(len(self.dataset), test_size, seed)
        self.dataset, self.val_dataset = self.dataset.select(train), self.dataset.select(held)

    def set_processor(self) -> None:
        """The processor the section's ``processor`` names (NeMo RL's ``default``: a chat
        row's question and reference answer)."""
        name = self.data_config.get("processor") or "default"
        if name not in PROCESSOR_REGISTRY:
            raise ValueError(
                f"processor {name!r} is not registered; use one of {sorted(PROCESSOR_REGISTRY)} "
                "or register it with nemo_rl_core.data.processors.register_processor"
            )
        self.processor = PROCESSOR_REGISTRY[name]

    def set_task_spec(self, data_config: Mapping[str, Any]) -> None:
        """Bind the section and read its prompt files (a missing one fails here, by key)."""
        self.data_config = data_config
        self.task_spec = TaskDataSpec(
            task_name=self.task_name,
            prompt_file=data_config.get("prompt_file"),
            system_prompt_file=data_config.get("system_prompt_file"),
        )


def task_name_of_path(data_path: str) -> str:
    """NeMo RL's task name of a local dataset: its folder and file name, without suffix
    (``data/train.jsonl`` -> ``data-train``)."""
    name = "-".join(data_path.split("/")[-2:]).split(".")[0]
    return name.removeprefix("-")
