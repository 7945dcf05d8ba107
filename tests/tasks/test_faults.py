"""The fault-injection seam: which faults ``NEMO_RL_CORE_FAULT`` asks of a stage, and the
damage it does through storage's public calls, once per run."""

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.run_storage import IntegrityError, RunStorage
from tasks.faults import FAULT_ENV, InjectedFault, StageFaults


def test_faults_are_asked_per_stage_and_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        FAULT_ENV, "reward@1,train@1:kill,reward/shard-0-of-2@1:damage,train@0:kill-rank1"
    )
    assert StageFaults.asked("reward", 1).modes == {"raise"}
    assert StageFaults.asked("train", 1).modes == {"kill"}
    assert StageFaults.asked("train", 0).modes == {"kill-rank1"}
    assert StageFaults.asked("reward/shard-0-of-2", 1).modes == {"damage"}
    assert StageFaults.asked("reward", 2).modes == set()
    with pytest.raises(InjectedFault, match="'reward' of iteration 1"):
        StageFaults.asked("reward", 1).before_compute()
    StageFaults.asked("train", 1).before_compute()  # a kill comes after compute


def test_a_stall_of_some_seconds_ends_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stall<s>``: a slow stage, not a stuck one (``stall``, which outlasts any test)."""
    monkeypatch.setenv(FAULT_ENV, "batch@1:stall1")
    started = time.monotonic()
    StageFaults.asked("batch", 1).before_compute()
    assert 1 <= time.monotonic() - started < 30


def test_kill_ends_the_process_and_its_children_after_compute(tmp_path) -> None:
    """The stage's process and a child it forked (a reward worker) are SIGKILLed."""
    child_pid = tmp_path / "child.pid"
    code = textwrap.dedent(
        f"""
        import subprocess, sys
        from tasks.faults import StageFaults
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(child_pid)!r}, "w").write(str(child.pid))
        StageFaults.asked("train", 1).before_compute()
        StageFaults.asked("train", 1).after_compute()
        print("still alive")
        """
    )
    env = {**os.environ, FAULT_ENV: "train@1:kill"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -9 and "still alive" not in done.stdout, done.stderr
    try:
        status = psutil.Process(int(child_pid.read_text())).status()
    except psutil.NoSuchProcess:
        status = None
    assert status in (None, psutil.STATUS_ZOMBIE), "the forked child outlived the kill"


def test_an_unknown_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "reward@1:explode")
    with pytest.raises(ValueError, match="'explode' in 'reward@1:explode'"):
        StageFaults.asked("generate", 0)


def test_damage_flips_a_byte_behind_the_manifest_until_its_repair_is_recorded(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = RunStorage(str(tmp_path), "faults")
    ref = storage.write_batch(2, "produce", BatchedDataDict({"x": torch.arange(8.0)}))
    storage.record_stage(2, "produce", {}, {"batch": ref})
    monkeypatch.setenv(FAULT_ENV, "produce@2:damage")
    faults = StageFaults.asked("produce", 2)
    assert faults.after_commit(storage, {"batch": ref}) == [ref.key]
    stored = (tmp_path / "runs" / "faults" / ref.key).read_bytes()
    assert len(stored) == ref.size
    with pytest.raises(IntegrityError, match="has sha256"):
        storage.read_batch(ref)
    assert storage.completed_stage(2, "produce", {}) is None

    remade = storage.write_batch(2, "produce", BatchedDataDict({"x": torch.arange(8.0)}))
    storage.record_repair(2, ref.key, "has sha256 ..., its reference says ...")
    assert faults.after_commit(storage, {"batch": remade}) == [], "the re-made one is spared"
    assert storage.read_batch(remade)["x"].tolist() == list(range(8))
    assert StageFaults.asked("consume", 2).after_commit(storage, {"batch": remade}) == []
