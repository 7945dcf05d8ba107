"""Checkpoints: what a committed checkpoint holds, and which weights version a stage worked
from. NeMo RL's ``checkpointing:`` section is :mod:`nemo_rl_core.config.checkpointing`'s,
importable here by NeMo RL's path.

A checkpoint is committed by the stage that trained it and is how weights reach the next
iteration. It holds each trained model in HF layout (the policy at its root, so vLLM and
transformers load the directory as is; others in their own sub-folder), the optimizer
state beside each, and ``training_info.json``: NeMo RL's save-state keys, the content
digest of every model's weights, the dataloader position and the step's metrics under
``train:<name>`` / ``val:<name>`` (what ``checkpointing.metric_name`` ranks by).
"""

import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from nemo_rl_core.config.checkpointing import CheckpointingConfig  # noqa: F401 - NeMo RL's path
from nemo_rl_core.utils.lazy_exports import lazy_exports

if TYPE_CHECKING:  # run storage loads torch and pyarrow; the config check reads this file
    from nemo_rl_core.storage.run_storage import RunStorage

# NeMo RL's path; its module reads this one's layout names.
__getattr__ = lazy_exports(__name__, {"CheckpointManager": "nemo_rl_core.utils.checkpoint_manager"})

# Where each trained model of an algorithm sits inside a checkpoint ("" = its root).
MODEL_DIRS = {"policy": "", "value": "value"}
WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_DIR = "optimizer"
INITIAL_STEP = 0  # step 0 is the model the run started from, never a stored checkpoint


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
    and the info as a reader of ``training_info.json`` gets it.

    Across the ranks of a training stage every rank calls it: the models gather their full
    state to rank 0 (collectives), which writes and commits; the others get its result."""
    from nemo_rl_core.distributed.world import from_writer, is_writer

    if is_writer():
        result = _commit(storage, step, models, dataloader_state, train_metrics)
    else:
        with tempfile.TemporaryDirectory(prefix="rank-ckpt-") as scratch:
            _save_models(Path(scratch), models)  # collectives; nothing is written here
        result = ("", {})
    url, record = from_writer(result)
    return url, TrainingInfo.model_validate(json.loads(json.dumps(record)))


def _save_models(local: Path, models: Mapping[str, Checkpointable]) -> None:
    for role, model in models.items():
        folder = local / MODEL_DIRS[role]
        model.save_checkpoint(weights_path=str(folder), optimizer_path=str(folder / OPTIMIZER_DIR))


def _commit(
    storage: "RunStorage",
    step: int,
    models: Mapping[str, Checkpointable],
    dataloader_state: dict[str, Any],
    train_metrics: Mapping[str, Any],
) -> tuple[str, dict[str, Any]]:
    with storage.staged_checkpoint(step) as local:
        _save_models(local, models)
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
        return storage.write_checkpoint(step, local, record), record


def recorded_files(folder: Path) -> dict[str, RecordedFile]:
    """Size and sha256 of every file under ``folder``."""
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    return {
        path.relative_to(folder).as_posix(): RecordedFile(size=path.stat().st_size, sha256=digest)
        for path, digest in zip(paths, file_digests(paths), strict=True)
    }


def file_digests(paths: list[Path]) -> list[str]:
    """sha256 of each file, hashed two at a time (sha256 releases the GIL, so the files are
    read and hashed side by side)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(file_digest, paths))


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
