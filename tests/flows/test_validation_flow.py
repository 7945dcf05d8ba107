"""The validate stage in a GRPO run: NeMo RL's schedule on the tiny model, metrics in the
manifest and the checkpoint's training info, a rerun bit-identical, nothing redone later."""

import json
from pathlib import Path

import pytest

from flows.grpo import grpo
from flows.rerun_stage import rerun_stage

pytestmark = pytest.mark.e2e
OVERRIDES = [
    "grpo.max_num_steps=2",
    "grpo.val_period=2",
    "grpo.val_at_start=true",
    "grpo.val_at_end=true",
    "grpo.max_val_samples=8",
    "grpo.val_batch_size=4",
    "checkpointing.metric_name=val:accuracy",
]


def stages(root: Path, iteration: int) -> dict:
    path = root / "runs" / "val" / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


@pytest.fixture(scope="module")
def validated(tiny_config: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("storage")
    summary = grpo(
        config_path=str(tiny_config), overrides=OVERRIDES, run_id="val", storage_root=str(root)
    )
    return root, summary


def test_validates_on_nemo_rl_schedule(validated):
    root, summary = validated
    # step 0 (val_at_start), step 2 (val_period and val_at_end), after the last update
    assert summary["iterations"] == [0, 1, 2]
    assert "validate" in stages(root, 0) and "validate" not in stages(root, 1)
    assert set(stages(root, 2)) == {"validate", "checkpoint"}
    for iteration in (0, 2):
        metrics = stages(root, iteration)["validate"]["metrics"]
        assert metrics["num_prompts"] == 8
        for key in ("accuracy", "pass@4", "greedy_accuracy"):
            assert 0.0 <= metrics[key] <= 1.0, (key, metrics)


def test_validation_metrics_join_the_checkpoint_info(validated):
    root, _ = validated
    info_path = root / "runs" / "val" / "checkpoints" / "step_000002" / "training_info.json"
    info = json.loads(info_path.read_text())
    validate = stages(root, 2)["validate"]["metrics"]
    assert info["val:accuracy"] == validate["accuracy"]
    assert "train:loss" in info


def test_rerun_of_validation_is_bit_identical(validated):
    root, _ = validated
    before = stages(root, 0)["validate"]["outputs"]["batch"]["sha256"]
    rerun_stage(run_id="val", iteration=0, stage="validate", storage_root=str(root))
    assert stages(root, 0)["validate"]["outputs"]["batch"]["sha256"] == before


def test_a_finished_run_continued_redoes_nothing(validated, tiny_config):
    root, _ = validated
    finished = {i: stages(root, i)["validate"]["finished_at"] for i in (0, 2)}
    grpo(config_path=str(tiny_config), overrides=OVERRIDES, run_id="val", storage_root=str(root))
    assert {i: stages(root, i)["validate"]["finished_at"] for i in (0, 2)} == finished
