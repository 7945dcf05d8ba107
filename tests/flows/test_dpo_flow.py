"""End to end: the DPO flow on the embedded default (tiny Llama, built-in addition
preference pairs; no server, local storage)."""

import shutil
from pathlib import Path

import pytest
from flow_testing import assert_bit_identical, checkpoint_dir, stages_of

from flows.dpo import dpo
from flows.rerun_stage import rerun_stage
from nemo_rl_core.pipeline.algorithms import DPO
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "dpo_tiny.yaml"
STEPS = 4
# Validation at the start and after step 4 (val_period 4): iteration 4 only validates.
# Every checkpoint stays, so that iteration 1's train can be rerun from its start.
OVERRIDES = [f"dpo.max_num_steps={STEPS}", "dpo.val_period=4", "checkpointing.keep_top_k=null"]
VAL = "validate/validation-default_"


def weights_after_run(root: Path, run_id: str) -> Path:
    return checkpoint_dir(root, run_id, STEPS)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("dpo")
    summary = dpo(
        config_path=str(CONFIG), overrides=OVERRIDES, run_id="clean", storage_root=str(root)
    )
    return root, summary


def test_preference_accuracy_and_reward_margin_improve(first_run):
    root, summary = first_run
    assert summary["iterations"] == [0, 1, 2, 3, 4]
    assert set(stages_of(root, "clean", 0)) == set(DPO.stage_names)
    assert set(stages_of(root, "clean", STEPS)) == {"validate", "checkpoint"}
    start, end = summary["metrics"][0], summary["metrics"][STEPS]
    # the policy starts as its reference: every reward is 0, no pair is ranked right yet
    assert start[f"{VAL}accuracy"] == 0.0
    assert start[f"{VAL}loss"] == pytest.approx(0.6931, abs=1e-4)  # log 2
    assert end[f"{VAL}accuracy"] >= 0.6
    margin = end[f"{VAL}rewards_chosen_mean"] - end[f"{VAL}rewards_rejected_mean"]
    assert margin > 0
    assert end[f"{VAL}loss"] < start[f"{VAL}loss"]


def test_failed_train_resumes_to_identical_weights(first_run, tmp_path, monkeypatch):
    clean_root, _ = first_run
    monkeypatch.setenv(FAULT_ENV, "train@1")
    with pytest.raises(Exception, match="fault injected into stage 'train' of iteration 1"):
        dpo(config_path=str(CONFIG), overrides=OVERRIDES, run_id="cut", storage_root=str(tmp_path))
    stored = stages_of(tmp_path, "cut", 1)
    assert set(stored) == {"batch", "reference"}
    monkeypatch.delenv(FAULT_ENV)
    dpo(config_path=str(CONFIG), overrides=OVERRIDES, run_id="cut", storage_root=str(tmp_path))
    resumed = stages_of(tmp_path, "cut", 1)
    for stage in ("batch", "reference"):  # the stored stages were read, not made again
        assert resumed[stage]["finished_at"] == stored[stage]["finished_at"], stage
    assert_bit_identical(weights_after_run(clean_root, "clean"), weights_after_run(tmp_path, "cut"))


def test_rerun_of_reference_and_train_is_bit_identical(first_run, tmp_path):
    root, _ = first_run
    recorded = stages_of(root, "clean", 1)
    before = Path(shutil.copytree(weights_after_run(root, "clean"), tmp_path / "before"))
    for stage in ("reference", "train"):
        outputs = rerun_stage(run_id="clean", iteration=1, stage=stage, storage_root=str(root))
        for name, ref in outputs.items():
            assert ref["sha256"] == recorded[stage]["outputs"][name]["sha256"], (stage, name)
    assert stages_of(root, "clean", 1)["checkpoint"]["status"] == "stale"
    dpo(config_path=str(CONFIG), overrides=OVERRIDES, run_id="clean", storage_root=str(root))
    assert all(s["status"] == "complete" for s in stages_of(root, "clean", 1).values())
    assert_bit_identical(before, weights_after_run(root, "clean"))
