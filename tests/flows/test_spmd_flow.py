"""The SFT flow with ``cluster.gpus_per_node: 2`` on a CPU machine: its train stage runs as 2
ranks of this machine (torchrun --standalone, gloo, FSDP2), every other stage in the flow's
process; the step equals the one-process flow's within 1e-5, also when a rank is lost."""

from pathlib import Path

import pytest
from flow_testing import stages_of

from flows.sft import sft
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.faults import FAULT_ENV, FAULT_NOTES

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "sft_tiny.yaml"
OVERRIDES = [
    "sft.max_num_steps=2",
    "sft.val_at_start=false",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
]


def test_train_stage_on_two_local_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 is killed in the middle of iteration 0's step: the stage task's retry starts
    every rank again and the run goes on."""
    for run_id, extra in (("single", []), ("ranks", ["cluster.gpus_per_node=2"])):
        if extra:
            monkeypatch.setenv(FAULT_ENV, "train@0:kill-rank1")
        sft(
            config_path=str(CONFIG),
            overrides=[*OVERRIDES, *extra],
            run_id=run_id,
            storage_root=str(tmp_path),
        )
    for iteration in (0, 1):
        expected = stages_of(tmp_path, "single", iteration)["train"]["metrics"]
        train = stages_of(tmp_path, "ranks", iteration)["train"]
        assert train["ran_on"]["ranks"] == 2
        assert "ranks" not in stages_of(tmp_path, "single", iteration)["train"]["ran_on"]
        got = train["metrics"]
        assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], abs=1e-5)
    assert (tmp_path / "runs" / "ranks" / "checkpoints" / "step_000002" / "COMMITTED").exists()
    fired = open_storage(RunRef(str(tmp_path), "ranks")).read_rendezvous_note(
        0, "train", FAULT_NOTES, "kill-rank1"
    )
    assert fired is not None, "rank 1 was killed once, and the retry trained"
