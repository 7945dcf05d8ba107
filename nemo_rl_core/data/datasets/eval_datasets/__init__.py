"""NeMo RL's evaluation datasets (``nemo_rl.data.datasets.eval_datasets``): a local file of
problems and reference solutions. NeMo RL's named benchmarks (AIME, GPQA, MATH, MMLU) are
downloaded from the hub, which this deployment never does: they are refused by name."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_rl_core.data.datasets.local_files import FILE_FORMATS, map_columns, read_local_rows
from nemo_rl_core.data.datasets.utils import HUB_REFUSAL
from nemo_rl_core.data.interfaces import TaskDataSpec
from nemo_rl_core.data.processors import math_data_processor


class LocalMathDataset:
    """Rows of a local file with each row's problem and solution columns renamed to
    ``problem`` and ``expected_answer`` (``rekeyed_ds``), scored by the math processor."""

    def __init__(
        self,
        data_path: str,
        problem_key: str,
        solution_key: str,
        split: str | None = None,
        file_format: str = "csv",
        prompt_file: str | None = None,
        system_prompt_file: str | None = None,
    ) -> None:
        from datasets import Dataset

        suffix = Path(data_path).suffix
        if file_format not in FILE_FORMATS or (suffix and suffix not in FILE_FORMATS[file_format]):
            raise ValueError(
                f"file_format={file_format!r} does not read {data_path!r}; use one of "
                f"{sorted(FILE_FORMATS)} matching the file's suffix"
            )
        rows = map_columns(
            read_local_rows(data_path, split),
            problem_key,
            solution_key,
            source=data_path,
            config_keys=("problem_key", "solution_key"),
        )
        keep = ("problem", "expected_answer")
        self.rekeyed_ds = Dataset.from_list([{key: row[key] for key in keep} for row in rows])
        self.task_spec = TaskDataSpec(
            task_name=Path(data_path).name.split(".")[0],  # NeMo RL's: the file's stem
            prompt_file=prompt_file,
            system_prompt_file=system_prompt_file,
        )
        self.processor = math_data_processor


def load_eval_dataset(data_config: Mapping[str, Any]) -> LocalMathDataset:
    """The local file ``data_config["dataset_name"]`` names, read through its
    ``problem_key`` and ``solution_key``; a hub benchmark's name is refused, saying why."""
    name = data_config["dataset_name"]
    if not Path(name).expanduser().exists():
        raise ValueError(f"dataset_name {name!r} {HUB_REFUSAL}")
    return LocalMathDataset(
        data_path=name,
        problem_key=data_config["problem_key"],
        solution_key=data_config["solution_key"],
        split=data_config.get("split"),
        file_format=data_config.get("file_format", "csv"),
        prompt_file=data_config.get("prompt_file"),
        system_prompt_file=data_config.get("system_prompt_file"),
    )


__all__ = ["LocalMathDataset", "load_eval_dataset"]
