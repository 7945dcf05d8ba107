"""A local copy of a committed checkpoint is whole and matches the digests its training
info recorded, or it is not there: one half made by a killed process is made again, and
a damaged stored file is named, never loaded."""

from pathlib import Path

import pytest

from nemo_rl_core.storage.run_storage import IntegrityError, RunStorage
from nemo_rl_core.utils.checkpoint import TrainingInfo, read_training_info, recorded_files
from nemo_rl_core.utils.checkpoint_copy import checkpoint_copy, copy_name

OPTIMIZER = "optimizer/optimizer.pt"


@pytest.fixture
def storage(storage_root: tuple[str, dict | None]) -> RunStorage:
    root, options = storage_root
    return RunStorage(root, "copies", storage_options=options)


def _commit(storage: RunStorage, tmp_path: Path, step: int, optimizer: bytes) -> TrainingInfo:
    """Checkpoint ``step`` as the train stage commits one: files, their digests, marker."""
    local = tmp_path / f"source-{step}-{optimizer[:8].hex()}"
    (local / "optimizer").mkdir(parents=True, exist_ok=True)
    (local / "model.safetensors").write_bytes(bytes([step]) * 4096)
    (local / OPTIMIZER).write_bytes(optimizer)
    info = TrainingInfo(
        current_step=step,
        total_steps=step,
        model_sha256={},
        dataloader_state={},
        files=recorded_files(local),
    )
    storage.write_checkpoint(step, local, info.model_dump(mode="json"))
    return read_training_info(storage, step)


def test_a_copy_is_verified_and_renamed_into_place(storage: RunStorage, tmp_path: Path) -> None:
    info = _commit(storage, tmp_path, 1, b"moments" * 1000)
    target = tmp_path / "copies" / "step_1"
    assert checkpoint_copy(storage, 1, info, target) == target
    assert (target / OPTIMIZER).read_bytes() == b"moments" * 1000
    assert [p.name for p in target.parent.iterdir()] == ["step_1"], "no fetch folder left"


def test_a_half_made_copy_is_made_again(storage: RunStorage, tmp_path: Path) -> None:
    """A chain killed while it copied the checkpoint left the folder with its config but a
    truncated optimizer state: the next flow run must not hand that on."""
    info = _commit(storage, tmp_path, 1, b"moments" * 1000)
    target = tmp_path / "copies" / "step_1"
    (target / "optimizer").mkdir(parents=True)
    (target / "model.safetensors").write_bytes(bytes([1]) * 4096)
    (target / OPTIMIZER).write_bytes(b"moments" * 10)
    checkpoint_copy(storage, 1, info, target)
    assert (target / OPTIMIZER).read_bytes() == b"moments" * 1000


def test_a_damaged_stored_file_is_named_and_never_placed(
    storage: RunStorage, tmp_path: Path
) -> None:
    info = _commit(storage, tmp_path, 1, b"moments" * 1000)
    key = f"{storage.objects.run_path}/checkpoints/step_000001/{OPTIMIZER}"
    storage.fs.pipe_file(key, b"moments" * 999 + b"MOMENTS")  # same size, other bytes
    target = tmp_path / "copies" / "step_1"
    with pytest.raises(IntegrityError, match=f"{OPTIMIZER} has sha256 .* recorded"):
        checkpoint_copy(storage, 1, info, target)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


def test_a_step_committed_again_with_other_contents_gets_its_own_copy(
    storage: RunStorage, tmp_path: Path
) -> None:
    first = _commit(storage, tmp_path, 2, b"a" * 100)
    assert copy_name(2, first) == copy_name(2, _commit(storage, tmp_path, 2, b"a" * 100))
    assert copy_name(2, first) != copy_name(2, _commit(storage, tmp_path, 2, b"b" * 100))
