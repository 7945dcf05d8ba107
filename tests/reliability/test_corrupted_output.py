"""A damaged stage output (same size, other bytes: the manifest's sha256 no longer
matches) is detected when it is read and its producing stage is re-executed, not trusted.
Through whole flow runs (found mid-run and on resume, ending with the uninterrupted run's
weights): tests/orchestration/test_damage.py."""

from pathlib import Path

import pytest
import torch

from flows.loop import run_iteration
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.pipeline.context import DamagedInputError, StageResult, read_input
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import RunStorage
from tasks.faults import FAULT_ENV
from tasks.stage import is_transient, run_stage


def test_damaged_input_is_re_made_by_its_producer_within_the_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunRef(str(tmp_path), "unit")
    calls = {"produce": 0, "consume": 0}

    def produce():
        calls["produce"] += 1
        return StageResult({"batch": BatchedDataDict(x=torch.arange(64, dtype=torch.float32))})

    def consume(made):
        calls["consume"] += 1
        batch = read_input(made.outputs["batch"], open_storage(run).read_batch)
        return StageResult({"sum": {"total": float(batch["x"].sum())}})

    def one_iteration() -> None:
        made = run_stage(run, 2, "produce", {}, produce)
        run_stage(run, 2, "consume", {"made": made.digest()}, lambda: consume(made))

    monkeypatch.setenv(FAULT_ENV, "produce@2:damage")
    assert run_iteration(one_iteration, run, 2) == ["iter_000002/produce/batch.arrow"]
    assert calls == {"produce": 2, "consume": 2}  # the first read found the damage
    manifest = RunStorage(str(tmp_path), "unit").read_manifest(2)
    assert manifest.complete("consume") is not None
    [repair] = manifest.repairs  # the repair is on record, with both digests
    assert repair.key == "iter_000002/produce/batch.arrow"
    assert "has sha256" in repair.damage and "its reference says" in repair.damage


def test_damaged_input_error_names_the_object_and_is_not_retried() -> None:
    err = DamagedInputError(
        "iter_000003/reward/batch.arrow", "has sha256 ab, its reference says cd"
    )
    assert (err.iteration, err.stage) == (3, "reward")
    assert str(err).startswith("input iter_000003/reward/batch.arrow (output of stage 'reward'")
    assert not is_transient(None, None, type("State", (), {"data": err})())
