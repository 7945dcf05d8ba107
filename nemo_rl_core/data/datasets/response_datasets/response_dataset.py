"""NeMo RL's ``ResponseDataset``: prompts and answers (or whole conversations) from a local
file, as chat rows (``messages``: the input as a user turn, the output as the assistant's)."""

from typing import Any

from nemo_rl_core.data.datasets.local_files import CHAT_COLUMN, map_columns
from nemo_rl_core.data.datasets.raw_dataset import RawDataset, task_name_of_path
from nemo_rl_core.data.datasets.utils import local_dataset_rows


class ResponseDataset(RawDataset):
    """Rows of ``data_path`` (JSONL/JSON, Parquet, CSV, Arrow, text, or a ``save_to_disk``
    folder): a row with ``messages`` is kept as that conversation, any other becomes one
    from its ``input_key`` and ``output_key`` columns (a row without either is refused,
    naming the file, row and key)."""

    def __init__(
        self,
        data_path: str,
        input_key: str = "input",
        output_key: str = "output",
        subset: str | None = None,
        split: str | None = None,
        split_validation_size: float = 0,
        seed: int = 42,
        **kwargs: Any,
    ) -> None:
        from datasets import Dataset

        self.input_key = input_key
        self.output_key = output_key
        self.task_name = task_name_of_path(data_path)
        rows = map_columns(
            local_dataset_rows(data_path, subset, split),
            input_key,
            output_key,
            source=data_path,
            chat_rows=True,
            config_keys=("input_key", "output_key"),
        )
        self.dataset = Dataset.from_list([self._chat_row(row) for row in rows])
        self.val_dataset = None
        self.split_train_validation(split_validation_size, seed)

    def _chat_row(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get(CHAT_COLUMN) is not None:  # a conversation, checked by map_columns
            return {**row, "task_name": self.task_name}
        question = {"role": "user", "content": row["problem"]}
        answer = {"role": "assistant", "content": row["expected_answer"]}
        return {CHAT_COLUMN: [question, answer], "task_name": self.task_name}
