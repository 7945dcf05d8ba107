"""Checkpoints: NeMo RL's ``checkpointing:`` section, what a committed checkpoint holds, and
which weights version a stage worked from.

``checkpoint_dir`` is the storage root of the run: a local path or an fsspec URL
(``s3://bucket/prefix``); runs, stage outputs and checkpoints all live below it.

A checkpoint is committed by the stage that trained it and is how weights reach the next
iteration. It holds each trained model in HF layout (the policy at its root, so vLLM and
transformers load the directory as is; others in their own sub-folder), the optimizer
state beside each, and ``training_info.json``: NeMo RL's save-state keys, the content
digest of every model's weights, the dataloader position and the step's metrics under
``train:<name>`` / ``val:<name>`` (what ``checkpointing.metric_name`` ranks by).
"""

import hashlib
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_rl_core.utils.key_support import Only, ReadWhile, Wired, inert, read_while_enabled
from nemo_rl_core.utils.timer import convert_to_seconds

if TYPE_CHECKING:  # run storage loads torch and pyarrow; the config check reads this file
    from nemo_rl_core.storage.run_storage import RunStorage

# Where each trained model of an algorithm sits inside a checkpoint ("" = its root).
MODEL_DIRS = {"policy": "", "value": "value"}
WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_DIR = "optimizer"
INITIAL_STEP = 0  # step 0 is the model the run started from, never a stored checkpoint


_RETENTION = Wired("nemo_rl_core.pipeline.stages:retain_checkpoints")


class CheckpointingConfig(BaseModel):
    """NeMo RL's ``checkpointing:``. Every iteration commits a checkpoint (the next one
    starts from it); ``save_period``, ``keep_top_k`` and ``metric_name`` decide which stay.

    ``enabled: false`` (NeMo RL keeps no checkpoint) still commits each iteration's weights,
    which the next stages load, but keeps only what continuing the run needs: the newest
    (and those rollouts in flight read). NeMo RL reads none of the other keys then, and no
    rule of theirs applies; ``checkpoint_dir`` stays the run's storage root."""

    model_config = ConfigDict(extra="forbid")
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
            "consolidated or sharded across NeMo RL's DTensor ranks: the one training process "
            "here writes one consolidated HF directory either way",
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


class Checkpointable(Protocol):
    """What a trained model offers the checkpoint: the seed interfaces' ``save_checkpoint``
    with NeMo RL's keyword arguments."""

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None: ...


@dataclass(frozen=True)
class WeightsVersion:
    """Which weights: ``step`` 0 is the initial model, step n the checkpoint after n updates;
    ``digest`` is the sha256 of the weight files' contents."""

    step: int
    digest: str


class RecordedFile(BaseModel):
    size: int
    sha256: str


class TrainingInfo(BaseModel):
    """``training_info.json`` of a checkpoint (NeMo RL's save-state keys, plus the digests and
    the dataloader position that resume and the stage inputs read, and every file's size
    and sha256 for ``RunStorage.verify``)."""

    model_config = ConfigDict(extra="allow")

    current_step: int
    total_steps: int
    model_sha256: dict[str, str]
    dataloader_state: dict[str, Any]
    files: dict[str, RecordedFile]

    def metric(self, name: str) -> float | None:
        value = (self.model_extra or {}).get(name)
        return float(value) if isinstance(value, int | float) else None


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@cache
def model_dir_digest(model_dir: Path) -> str:
    """Content digest of a model directory's weight files (names and bytes): the same
    weights give the same digest wherever the folder was copied to. Cached per process:
    an initial model directory does not change while a run reads it."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(f"{path.name}:{file_digest(path)}\n".encode())
    return digest.hexdigest()


def commit_trained_checkpoint(
    storage: "RunStorage",
    step: int,
    models: Mapping[str, Checkpointable],
    dataloader_state: dict[str, Any],
    train_metrics: Mapping[str, Any],
) -> tuple[str, TrainingInfo]:
    """Save every trained model of ``models`` (keys of :data:`MODEL_DIRS`) with its optimizer
    state into checkpoint ``step``, record its training info and commit it; returns its URL
    and the info as a reader of ``training_info.json`` gets it."""
    with storage.staged_checkpoint(step) as local:
        for role, model in models.items():
            folder = local / MODEL_DIRS[role]
            model.save_checkpoint(
                weights_path=str(folder), optimizer_path=str(folder / OPTIMIZER_DIR)
            )
        files = recorded_files(local)
        info = TrainingInfo(
            current_step=step,
            total_steps=step,
            model_sha256={
                role: files[(Path(MODEL_DIRS[role]) / WEIGHTS_FILE).as_posix()].sha256
                for role in models
            },
            dataloader_state=dataloader_state,
            files=files,
            **{
                f"train:{name}": value
                for name, value in train_metrics.items()
                if isinstance(value, int | float)
            },
        )
        record = info.model_dump(mode="json")
        url = storage.write_checkpoint(step, local, record)
    return url, TrainingInfo.model_validate(json.loads(json.dumps(record)))


def recorded_files(folder: Path) -> dict[str, RecordedFile]:
    """Size and sha256 of every file under ``folder``, hashed two at a time (sha256 releases
    the GIL, so the files are read and hashed side by side)."""
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    with ThreadPoolExecutor(max_workers=2) as pool:
        digests = list(pool.map(file_digest, paths))
    return {
        path.relative_to(folder).as_posix(): RecordedFile(size=path.stat().st_size, sha256=digest)
        for path, digest in zip(paths, digests, strict=True)
    }


def read_training_info(storage: "RunStorage", step: int) -> TrainingInfo:
    return TrainingInfo.model_validate(storage.read_checkpoint_info(step))


def weights_version(
    initial_dir: Path, step: int, role: str, committed_info: Callable[[int], TrainingInfo]
) -> WeightsVersion:
    """The weights of ``role`` at the start of iteration ``step``: the initial model's for
    step 0, else the digest the committing stage recorded (``committed_info(step)``)."""
    if step == INITIAL_STEP:
        return WeightsVersion(step, model_dir_digest(initial_dir))
    return WeightsVersion(step, committed_info(step).model_sha256[role])
