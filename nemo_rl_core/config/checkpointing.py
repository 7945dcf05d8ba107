"""NeMo RL's ``checkpointing:`` section.

``checkpoint_dir`` is the storage root of the run: a local path or an fsspec URL
(``s3://bucket/prefix``); runs, stage outputs and checkpoints all live below it. What a
committed checkpoint holds is :mod:`nemo_rl_core.utils.checkpoint`'s.
"""

from typing import Annotated, ClassVar

from pydantic import Field, field_validator

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.utils.key_support import Only, ReadWhile, Wired, inert, read_while_enabled
from nemo_rl_core.utils.timer import convert_to_seconds

_RETENTION = Wired("nemo_rl_core.pipeline.runtime:RunRuntime.prune_checkpoints")


class CheckpointingConfig(StrictConfig):
    """NeMo RL's ``checkpointing:``. Every iteration commits a checkpoint (the next one
    starts from it); ``save_period``, ``keep_top_k`` and ``metric_name`` decide which stay.

    ``enabled: false`` (NeMo RL keeps no checkpoint) still commits each iteration's weights,
    which the next stages load, but keeps only what continuing the run needs: the newest
    (and those rollouts in flight read). NeMo RL reads none of the other keys then, and no
    rule of theirs applies; ``checkpoint_dir`` stays the run's storage root."""

    read_while: ClassVar[ReadWhile] = ReadWhile(
        read_while_enabled, still_read=("enabled", "checkpoint_dir")
    )

    enabled: Annotated[bool, _RETENTION] = True
    checkpoint_dir: Annotated[str, Wired("flows.run_setup:open_run")] = "results"
    metric_name: Annotated[str | None, _RETENTION] = None
    higher_is_better: Annotated[bool, _RETENTION] = True
    keep_top_k: Annotated[int | None, _RETENTION] = Field(default=None, ge=1)
    save_period: Annotated[int, _RETENTION] = Field(default=1, ge=1)
    # DD:HH:MM:SS after the flow run starts; it stops one average iteration early.
    checkpoint_must_save_by: Annotated[str | None, Wired("flows.loop:run_iterations")] = None
    # null: NeMo RL's "the policy worker's own format" (its v1 DTensor worker's); the one
    # policy backend here writes HF safetensors.
    model_save_format: Annotated[
        str | None,
        Only(
            "safetensors",
            None,
            reason="checkpoints are HF safetensors directories that transformers, vLLM and "
            "the next stage load; torch_save (DCP) is not written",
        ),
    ] = "safetensors"
    save_consolidated: Annotated[
        bool,
        inert(
            "consolidated or sharded across NeMo RL's DTensor ranks: rank 0 here writes one "
            "consolidated HF directory at any world size",
        ),
    ] = True
    save_optimizer: Annotated[
        bool,
        Only(
            True,
            reason="each iteration's train stage resumes the optimizer from the checkpoint "
            "before it; without the saved state every step would start a fresh optimizer",
        ),
    ] = True

    @field_validator("checkpoint_must_save_by")
    @classmethod
    def _deadline_format(cls, value: str | None) -> str | None:
        if value is not None:
            convert_to_seconds(value)
        return value
