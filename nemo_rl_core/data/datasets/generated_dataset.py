"""The built-in generators (``addition``, ``countdown``, ...) behind NeMo RL's dataset
interface: a script's ``load_response_dataset({"dataset_name": "addition"})`` gets the rows
and processor a flow builds from the same section."""

from typing import Any

from nemo_rl_core.data.config import SPLITS, DatasetConfig, task_name
from nemo_rl_core.data.datasets.builder import (
    DataSetup,
    bound_processor,
    dataset_rows,
    processor_name,
)
from nemo_rl_core.data.datasets.raw_dataset import RawDataset


class GeneratedDataset(RawDataset):
    """A built-in generator's rows: ``split`` ``train`` (the default) or ``validation``
    (the held-out rows a run validates on). The section is validated as a ``data:`` dataset,
    so a misspelt key is refused by name."""

    def __init__(self, **section: Any) -> None:
        from datasets import Dataset

        self.section = DatasetConfig.model_validate(section)
        split = self.section.split or "train"
        if split not in SPLITS:
            raise ValueError(
                f"split={split!r}: the built-in {self.section.dataset_name!r} draws {SPLITS} rows"
            )
        self.task_name = task_name(self.section)
        rows = dataset_rows(self.section, split, DataSetup())
        self.dataset = Dataset.from_list([{**row, "task_name": self.task_name} for row in rows])
        self.val_dataset = None
        self.split_train_validation(self.section.split_validation_size, self.section.seed)

    def set_processor(self) -> None:
        """The processor a flow gives this section (the generator's own by default)."""
        setup = DataSetup()
        self.processor = bound_processor(processor_name(self.section, setup), setup)


class UnavailableDataset:
    """A NeMo RL dataset that does not load here (hub, multimodal, Gym): it validates in a
    config, and a script that loads it is told why."""

    def __init__(self, dataset_name: str, reason: str | None, **section: Any) -> None:
        raise ValueError(f"dataset_name {dataset_name!r}: {reason}")
