"""End to end: the DPO flow on the embedded default (tiny Llama, built-in addition
preference pairs; no server, local storage). A resume and a rerun to the same weights:
tests/orchestration (the rules) and test_grpo_flow.py (bit-identical on a real model)."""

from pathlib import Path

import pytest
from flow_testing import stages_of

from flows.dpo import dpo
from nemo_rl_core.pipeline.algorithms import DPO

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "dpo_tiny.yaml"
STEPS = 4
# Validation at the start and after step 4 (val_period 4): iteration 4 only validates.
OVERRIDES = [f"dpo.max_num_steps={STEPS}", "dpo.val_period=4"]
VAL = "validate/validation-default_"


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
