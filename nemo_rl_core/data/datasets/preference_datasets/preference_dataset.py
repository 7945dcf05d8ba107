"""NeMo RL's preference datasets from local files: ``PreferenceDataset`` (its own format: a
``context`` and ranked ``completions``) and ``BinaryPreferenceDataset`` (a prompt, a chosen
and a rejected response), both checked row by row as the flows check them."""

from typing import Any

from nemo_rl_core.data.datasets.local_files import preference_rows
from nemo_rl_core.data.datasets.raw_dataset import RawDataset, task_name_of_path
from nemo_rl_core.data.datasets.utils import local_dataset_rows


class PreferenceDataset(RawDataset):
    """Rows already in NeMo RL's preference format, each given the dataset's task name."""

    def __init__(
        self,
        data_path: str,
        subset: str | None = None,
        split: str | None = None,
        **kwargs: Any,
    ) -> None:
        from datasets import Dataset

        self.task_name = task_name_of_path(data_path)
        rows = preference_rows(local_dataset_rows(data_path, subset, split), data_path)
        self.dataset = Dataset.from_list([{**row, "task_name": self.task_name} for row in rows])
        self.val_dataset = None


class BinaryPreferenceDataset(RawDataset):
    """A prompt (text, or a list of turns), a chosen and a rejected response per row, in
    NeMo RL's preference format: the prompt as context, the chosen completion ranked 0."""

    def __init__(
        self,
        data_path: str,
        prompt_key: str = "prompt",
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
        subset: str | None = None,
        split: str | None = None,
        **kwargs: Any,
    ) -> None:
        from datasets import Dataset

        self.prompt_key, self.chosen_key, self.rejected_key = prompt_key, chosen_key, rejected_key
        self.task_name = task_name_of_path(data_path)
        keys = (prompt_key, chosen_key, rejected_key)
        rows = preference_rows(local_dataset_rows(data_path, subset, split), data_path, keys)
        self.dataset = Dataset.from_list(
            [
                {
                    "context": row["context"],
                    "completions": row["completions"],
                    "task_name": self.task_name,
                }
                for row in rows
            ]
        )
        self.val_dataset = None
