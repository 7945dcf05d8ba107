"""NeMo RL's ``openai_format`` SFT dataset: conversations in the OpenAI chat format (tool
calls and the ``tools`` offered included) from a local file, and ``PreservingDataset``,
which keeps each row as written where Hugging Face would fill the missing keys of
heterogeneous tool schemas with nulls."""

from collections.abc import Callable, Iterator
from typing import Any

from nemo_rl_core.data.datasets.local_files import openai_rows
from nemo_rl_core.data.datasets.raw_dataset import RawDataset, task_name_of_path
from nemo_rl_core.data.datasets.utils import local_dataset_rows


class PreservingDataset:
    """A list of rows with a dataset's interface (length, indexing, iteration, ``map``)."""

    def __init__(self, data: list[dict[str, Any]]) -> None:
        self.data = data
        self.features = None  # Hugging Face's attribute; no schema is inferred here

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int | slice | list[int]) -> Any:
        if isinstance(index, slice):
            return self.data[index]
        if isinstance(index, list):
            return [self.data[i] for i in index]
        if not isinstance(index, int):
            raise TypeError(f"Indices must be integers, slices, or lists, not {type(index)}")
        if not -len(self.data) <= index < len(self.data):
            raise IndexError(f"Index {index} out of range for dataset of size {len(self.data)}")
        return self.data[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.data)

    def map(
        self, function: Callable[..., dict[str, Any]], with_indices: bool = False, **_: Any
    ) -> "PreservingDataset":
        """A new dataset of ``function`` applied to each row (and its index)."""
        if with_indices:
            return PreservingDataset([function(row, i) for i, row in enumerate(self.data)])
        return PreservingDataset([function(row) for row in self.data])


class OpenAIFormatDataset(RawDataset):
    """Rows of ``data_path`` as ``messages`` (after the row's ``system_key`` or
    ``system_prompt``) and ``tools``; each conversation must end with the assistant."""

    def __init__(
        self,
        data_path: str,
        chat_key: str = "messages",
        system_key: str | None = None,
        system_prompt: str | None = None,
        tool_key: str | None = "tools",
        use_preserving_dataset: bool = False,
        **kwargs: Any,
    ) -> None:
        self.chat_key, self.system_key, self.system_prompt = chat_key, system_key, system_prompt
        self.tool_key = tool_key
        self.task_name = task_name_of_path(data_path)
        raw = local_dataset_rows(data_path)
        rows = [
            {**row, "task_name": self.task_name}
            for row in openai_rows(raw, data_path, chat_key, system_key, system_prompt, tool_key)
        ]
        if use_preserving_dataset:
            self.dataset: Any = PreservingDataset(rows)
        else:
            from datasets import Dataset

            self.dataset = Dataset.from_list(rows)
        self.val_dataset = None
