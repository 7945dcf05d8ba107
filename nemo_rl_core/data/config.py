"""The ``data:`` section of a run config (NeMo RL's keys), validated once at setup."""

from pydantic import BaseModel, ConfigDict, Field, model_validator

BUILTIN_DATASETS = ("arithmetic", "countdown", "sliding_puzzle")
LOCAL_DATASET = "ResponseDataset"  # NeMo RL's name for "rows from my own files"


class DataConfig(BaseModel):
    """Where prompts come from and how they are shaped.

    ``dataset_name`` is a built-in generator (``arithmetic``, ``countdown``,
    ``sliding_puzzle``; ``num_samples`` rows from ``seed``) or ``ResponseDataset``: rows
    from ``train_data_path`` (``.jsonl``, ``.parquet`` or a ``save_to_disk`` folder), with
    ``input_key``/``output_key`` naming the prompt and answer columns.
    """

    model_config = ConfigDict(extra="forbid")

    dataset_name: str = "arithmetic"
    train_data_path: str | None = None
    val_data_path: str | None = None
    input_key: str = "input"
    output_key: str = "output"
    split: str | None = None
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    max_input_seq_length: int = Field(512, ge=1)
    shuffle: bool = True
    seed: int = 42
    drop_last: bool = True
    num_workers: int = Field(
        1, ge=0, description="accepted for NeMo RL configs; loading is in-process"
    )
    env_name: str | None = Field(None, description="task_name of the rows (default: per dataset)")
    num_samples: int = Field(1024, ge=1, description="rows of a built-in generator")
    val_num_samples: int = Field(64, ge=0)
    puzzle_size: int = Field(3, ge=2)
    puzzle_shuffle_moves: int = Field(10, ge=0)
    puzzle_max_moves: int = Field(20, ge=1)

    @model_validator(mode="after")
    def _known_dataset(self) -> "DataConfig":
        if self.dataset_name == LOCAL_DATASET:
            if not self.train_data_path:
                raise ValueError(
                    "data.train_data_path is required when data.dataset_name is 'ResponseDataset'"
                )
        elif self.dataset_name not in BUILTIN_DATASETS:
            raise ValueError(
                f"data.dataset_name {self.dataset_name!r} is unknown; use one of "
                f"{', '.join(BUILTIN_DATASETS)} or {LOCAL_DATASET!r} with data.train_data_path"
            )
        return self
