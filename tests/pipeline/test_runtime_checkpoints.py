"""A run's warm runtime reads checkpoints from two threads under async GRPO (the rollouts
ahead refit the engine while this iteration builds its policy): a local copy one thread
reads is never rewritten by the other, and every copy is checked against the digests its
training info recorded."""

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fsspec.implementations.local import LocalFileSystem

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.pipeline.runtime import RunRuntime, close_runtime, runtime_for
from nemo_rl_core.storage.handles import RunRef, open_storage

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_addition_tiny.yaml"
ASYNC = [
    "grpo.async_grpo.enabled=true",
    "grpo.async_grpo.max_trajectory_age_steps=2",
    "loss_fn.use_importance_sampling_correction=true",
]
OPTIMIZER_FILE = "optimizer/optimizer.pt"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[RunRuntime]:
    """A runtime whose run has checkpoint 1 committed by the real policy."""
    run = RunRef(str(tmp_path / "store"), "race")
    config = load_master_config(str(CONFIG), ASYNC)
    open_storage(run).write_run_config(config.model_dump(mode="json"))
    rt = runtime_for(run)
    rt.commit_checkpoint(1, {"policy": rt.policy(0)}, {}, {})
    yield rt
    close_runtime(run)


def test_a_copy_being_read_is_never_rewritten_by_another_thread(runtime, monkeypatch):
    """The failure of issue 34: the flow thread's ``policy(3)`` had ``weights_dir(3)`` copy
    the checkpoint and was reading its optimizer state, when the rollout thread's refit
    called ``weights_dir(3)`` too and copied the checkpoint again over the same files. The
    second copy is held half-written here until the reader has read."""
    path = runtime.weights_dir(1)
    whole = (path / OPTIMIZER_FILE).read_bytes()
    half_written, finish = threading.Event(), threading.Event()
    monkeypatch.setattr(LocalFileSystem, "get_file", _held_half_written(half_written, finish))
    refit = threading.Thread(target=runtime.weights_dir, args=(1,))
    refit.start()
    while refit.is_alive() and not half_written.wait(timeout=0.05):
        pass
    try:
        read = (path / OPTIMIZER_FILE).read_bytes()
        state = torch.load(path / OPTIMIZER_FILE, weights_only=True)
    finally:
        finish.set()
        refit.join()
    assert read == whole
    assert "param_groups" in state
    assert runtime.weights_dir(1) == path


def test_retention_waits_for_a_copy_in_flight(runtime, monkeypatch):
    """The flow thread prunes (``keep_top_k: 1``; the newest ``age + 1`` stay) while the
    rollout thread copies step 1, which the prune deletes: the copy finishes first, whole."""
    for step in (2, 3, 4):
        runtime.commit_checkpoint(step, {"policy": runtime.policy(step - 1)}, {}, {})
    stored = Path(runtime.storage.run_url) / "checkpoints" / "step_000001"
    half_written, finish = threading.Event(), threading.Event()
    monkeypatch.setattr(LocalFileSystem, "get_file", _held_half_written(half_written, finish))
    with ThreadPoolExecutor(max_workers=2) as threads:
        copied = threads.submit(runtime.weights_dir, 1)
        assert half_written.wait(timeout=60)
        pruned = threads.submit(runtime.prune_checkpoints)
        with pytest.raises(TimeoutError):
            pruned.result(timeout=2)  # it waits for the copy
        assert (stored / OPTIMIZER_FILE).is_file()
        finish.set()
        folder = copied.result(timeout=60)
        assert pruned.result(timeout=60).deleted == [1]
    assert (folder / OPTIMIZER_FILE).is_file()
    assert runtime.storage.committed_checkpoints() == [2, 3, 4]


def _held_half_written(half_written: threading.Event, finish: threading.Event):
    """A local copy that writes the first half of an optimizer file, says so, and writes
    the rest once ``finish`` is set: a slow write on a loaded machine, held open."""
    copy = LocalFileSystem.get_file

    def slow_copy(self: LocalFileSystem, rpath: str, lpath: str, **kwargs: object) -> None:
        if not str(lpath).endswith(OPTIMIZER_FILE):
            return copy(self, rpath, lpath, **kwargs)
        data = Path(rpath).read_bytes()
        with open(lpath, "wb") as file:
            file.write(data[: len(data) // 2])
            file.flush()
            half_written.set()
            finish.wait(timeout=30)
            file.write(data[len(data) // 2 :])

    return slow_copy
