"""A damaged stage output (same size, other bytes: the manifest's sha256 no longer
matches) is detected when it is read and its producing stage is re-executed, not trusted:
by the next stage within the running flow, or by a resumed run; either way the run ends
with the weights of an uninterrupted run."""

import json
from pathlib import Path

import pytest
import torch
from reliability_helpers import (
    CONFIG,
    assert_no_half_written_objects,
    assert_same_weights,
    final_weights,
    run_dir,
)

from flows.grpo import grpo
from flows.loop import run_iteration
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.pipeline.context import DamagedInputError, StageResult, read_input
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import RunStorage
from tasks.faults import FAULT_ENV
from tasks.stage import is_transient, run_stage


def _stages(root: Path, run_id: str) -> dict:
    manifest = run_dir(root, run_id) / "iter_000001" / "MANIFEST.json"
    return json.loads(manifest.read_text())["stages"]


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


@pytest.mark.e2e
def test_damage_found_mid_run_re_executes_the_producer(
    clean_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    # generate@1 commits, then one byte of its output flips; reward reads it next.
    monkeypatch.setenv(FAULT_ENV, "generate@1:damage")
    state = grpo(
        config_path=str(CONFIG),
        run_id="damaged",
        storage_root=str(tmp_path),
        return_state=True,
    )
    assert state.is_completed(), state.message
    key = "iter_000001/generate/batch.arrow"
    assert state.result()["remade"] == [key]

    # Evidence from the run itself (Prefect's task-run records arrive through its events
    # pipeline, which the ephemeral API may drop under a long test session).
    assert f"{key} (output of stage 'generate' of iteration 1) is damaged" in caplog.text
    # Re-executed from its stored inputs, the output is the uninterrupted run's, byte for byte.
    clean, damaged = _stages(clean_run, "clean"), _stages(tmp_path, "damaged")
    assert damaged["generate"]["outputs"] == clean["generate"]["outputs"]
    storage = RunStorage(str(tmp_path), "damaged")
    assert_same_weights(final_weights(RunStorage(str(clean_run), "clean")), final_weights(storage))
    assert_no_half_written_objects(storage)


@pytest.mark.e2e
def test_damage_found_on_resume_re_executes_the_producer(
    clean_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "train@1")
    with pytest.raises(Exception, match="fault injected into stage 'train' of iteration 1"):
        grpo(config_path=str(CONFIG), run_id="damaged", storage_root=str(tmp_path))
    monkeypatch.delenv(FAULT_ENV)
    before = _stages(tmp_path, "damaged")
    damaged = run_dir(tmp_path, "damaged") / before["reward"]["outputs"]["batch"]["key"]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, size unchanged
    damaged.write_bytes(bytes(data))

    grpo(config_path=str(CONFIG), run_id="damaged", storage_root=str(tmp_path))

    after = _stages(tmp_path, "damaged")
    assert after["reward"]["finished_at"] != before["reward"]["finished_at"], "damage trusted"
    assert after["reward"]["outputs"] == before["reward"]["outputs"], "not bit-identical"
    for stage in ("prompts", "generate", "logprob", "advantage"):
        assert after[stage]["finished_at"] == before[stage]["finished_at"], f"{stage} redone"
    storage = RunStorage(str(tmp_path), "damaged")
    assert_same_weights(final_weights(RunStorage(str(clean_run), "clean")), final_weights(storage))
    assert_no_half_written_objects(storage)
