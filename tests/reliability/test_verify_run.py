"""The verify-run flow on a damaged run: it checks stale entries too and says they are
stale, and a run with damage ends the flow run Failed, its state message naming the
damaged objects (a Completed verify-run means every object is intact)."""

from pathlib import Path

import pytest
import torch

from flows.verify import verify_run
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.run_storage import RunStorage
from nemo_rl_core.storage.verification import DamagedRunError


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_stale_stage_fails_the_verify_flow_run(
    prefect_api, tmp_path: Path
) -> None:
    storage = RunStorage(str(tmp_path), "rerun")
    batch = BatchedDataDict({"x": torch.arange(32, dtype=torch.float32)})
    refs = {}
    for stage in ("reward", "logprob", "advantage"):
        refs[stage] = storage.write_batch(1, stage, batch)
        storage.record_stage(1, stage, {}, {"batch": refs[stage]})
    storage.mark_stale(1, ["logprob", "advantage"])  # as a rerun of reward leaves them

    intact = verify_run(run_id="rerun", storage_root=str(tmp_path), return_state=True)
    assert intact.is_completed()
    assert sorted(intact.result().stale) == [
        f"iteration 1 stage {stage}: stale (marked to be redone), 1 output(s) checked"
        for stage in ("advantage", "logprob")
    ]

    flip_a_byte(tmp_path / "runs" / "rerun" / refs["logprob"].key)
    state = verify_run(run_id="rerun", storage_root=str(tmp_path), return_state=True)
    assert state.is_failed()
    url = f"{tmp_path}/runs/rerun/{refs['logprob'].key}"
    assert state.message.startswith("run rerun: 3 objects checked (stale entries among them: 2)")
    assert f"1 damaged: {url} has sha256 " in state.message
    assert "(iteration 1 stage logprob, a stale entry" in state.message
    with pytest.raises(DamagedRunError) as raised:
        state.result()
    assert [url in line for line in raised.value.check.damaged] == [True]
