"""NeMo RL's ``checkpointing:`` section (``nemo_rl.utils.checkpoint.CheckpointingConfig``).

``checkpoint_dir`` is the storage root of the run: a local path or an fsspec URL
(``s3://bucket/prefix``); runs, stage outputs and checkpoints all live below it.
"""

from pydantic import BaseModel, ConfigDict, Field


class CheckpointingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    checkpoint_dir: str = "results"
    metric_name: str | None = None
    higher_is_better: bool = True
    keep_top_k: int | None = Field(default=None, ge=1)
    save_period: int = Field(default=1, ge=1)
    checkpoint_must_save_by: str | None = None
    model_save_format: str = "safetensors"
    save_consolidated: bool = True
