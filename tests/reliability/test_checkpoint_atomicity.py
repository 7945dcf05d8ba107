"""Checkpoint atomicity: a process SIGKILLed while it writes a checkpoint leaves the
previous checkpoint as the newest COMMITTED one, and a resume starts from it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows.run_setup import first_iteration
from nemo_rl_core.pipeline.algorithms import GRPO
from nemo_rl_core.storage.run_storage import RunStorage, StorageError

# The child writes step 1 whole, then dies (SIGKILL) in the middle of step 2: after its
# weight files and training_info.json, before the COMMITTED marker.
WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from nemo_rl_core.storage.run_storage import COMMITTED, RunStorage

    root, source = sys.argv[1], Path(sys.argv[2])
    storage = RunStorage(root, "ckpt-run")
    storage.write_checkpoint(1, source, {"step": 1})
    real_put = storage.objects.put

    def put_then_die(key, data):
        if key.endswith(COMMITTED):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_put(key, data)

    storage.objects.put = put_then_die
    storage.write_checkpoint(2, source, {"step": 2})
    """
)


def _checkpoint_source(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    (source / "optimizer").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(b"w" * 4096)
    (source / "optimizer" / "optim.pt").write_bytes(b"o" * 1024)
    return source


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_killed_checkpoint_write_keeps_previous_as_newest_committed(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "file":
        root, env = str(tmp_path / "store"), None
    else:
        server = request.getfixturevalue("s3_server")
        root = f"s3://{request.getfixturevalue('s3_bucket')}/p"
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL_S3": server.endpoint_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    done = subprocess.run(
        [sys.executable, "-c", WRITER, root, str(_checkpoint_source(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr

    options = None if env is None else request.getfixturevalue("s3_server").storage_options
    storage = RunStorage(root, "ckpt-run", storage_options=options)
    # The weights of step 2 reached storage, its marker did not.
    assert storage.objects.exists("checkpoints/step_000002/model.safetensors")
    assert storage.committed_checkpoints() == [1]
    assert storage.latest_checkpoint() == 1
    assert first_iteration(GRPO, storage) == 1, "resume must start after the last committed step"
    with pytest.raises(StorageError, match="step_000002 is not a committed checkpoint"):
        storage.fetch_checkpoint(2, tmp_path / "fetched")
    fetched = storage.fetch_checkpoint(1, tmp_path / "fetched1")
    assert (fetched / "model.safetensors").read_bytes() == b"w" * 4096
    # The retried write replaces the leftover and commits.
    storage.write_checkpoint(2, _checkpoint_source(tmp_path / "again"), {"step": 2})
    assert storage.latest_checkpoint() == 2


def test_staged_checkpoint_commits_by_rename_and_a_dead_save_is_pruned(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "store"), "ckpt-run")
    checkpoints = tmp_path / "store" / "runs" / "ckpt-run" / "checkpoints"
    with storage.staged_checkpoint(1) as staged:
        assert staged.parent == checkpoints, "staged on the storage's own disk"
        (staged / "model.safetensors").write_bytes(b"w" * 4096)
        inode = (staged / "model.safetensors").stat().st_ino
        storage.write_checkpoint(1, staged, {"step": 1})
    assert not staged.exists()
    committed = checkpoints / "step_000001" / "model.safetensors"
    assert committed.stat().st_ino == inode, "committed by rename, not by a copy"
    assert storage.read_checkpoint_info(1) == {"step": 1}

    with pytest.raises(RuntimeError, match="save failed"), storage.staged_checkpoint(2) as failed:
        (failed / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("save failed")
    assert not failed.exists(), "a failed save leaves no staging directory"

    # A process killed while saving leaves its staging directory: never a checkpoint,
    # not where a resume starts, deleted by the next prune.
    dead = storage.staged_checkpoint(2)
    leftover = dead.__enter__()
    (leftover / "model.safetensors").write_bytes(b"half")
    assert storage.committed_checkpoints() == [1]
    assert first_iteration(GRPO, storage) == 1
    storage.prune_checkpoints(keep_top_k=None)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000001"]


class _Killed(BaseException):
    """The process dying at this point (raised where a SIGKILL would land)."""


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_a_prune_cut_short_leaves_no_committed_checkpoint_with_files_missing(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention, or a re-save replacing a step, killed after it deleted the optimizer state
    of a checkpoint and before the rest: a resume must not trust what is left."""
    if backend == "file":
        storage = RunStorage(str(tmp_path / "store"), "ckpt-run")
    else:
        options = dict(request.getfixturevalue("s3_server").storage_options)
        bucket = request.getfixturevalue("s3_bucket")
        storage = RunStorage(f"s3://{bucket}/p", "ckpt-run", storage_options=options)
    for step in (1, 2):
        storage.write_checkpoint(step, _checkpoint_source(tmp_path / f"s{step}"), {"step": step})
    optimizer = f"{storage.objects.run_path}/checkpoints/step_000001/optimizer/optim.pt"
    delete = storage.fs.rm

    def die_after_the_optimizer(path: str | list[str], *args: object, **kwargs: object) -> None:
        paths = [path] if isinstance(path, str) else list(path)
        if any(optimizer == p or optimizer.startswith(p.rstrip("/") + "/") for p in paths):
            delete([optimizer])
            raise _Killed
        delete(path, *args, **kwargs)

    monkeypatch.setattr(storage.fs, "rm", die_after_the_optimizer)
    with pytest.raises(_Killed):
        storage.prune_checkpoints(keep_top_k=1)
    monkeypatch.undo()
    assert not storage.fs.exists(optimizer)
    assert storage.committed_checkpoints() == [2]
    with pytest.raises(StorageError, match="step_000001 is not a committed checkpoint"):
        storage.fetch_checkpoint(1, tmp_path / "fetched")
    assert storage.prune_checkpoints(keep_top_k=1).deleted == [1], (
        "the leftover goes at the next prune"
    )
