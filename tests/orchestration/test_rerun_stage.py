"""Rerun of one stage (``flows.rerun_stage``) and what goes stale: the stage is recomputed
from its stored inputs, bit-identically; it and every stage that reads it, directly or
through others, are marked stale (the validation of the weights the iteration started from
is not); the next continue recomputes them, to the same weights. Validation runs on NeMo
RL's schedule, its metrics join the checkpoint's training info, and a finished run
continued redoes nothing."""

import json

import pytest
from toy_runs import ToyRuns

from flows.rerun_stage import rerun_stage

VALIDATED = (
    "toy.max_num_steps=2",
    "toy.val_period=2",
    "toy.val_at_start=true",
    "toy.val_at_end=true",
    "checkpointing.metric_name=val:accuracy",
)


@pytest.fixture(scope="module")
def validated(tmp_path_factory: pytest.TempPathFactory, toy_model) -> ToyRuns:
    runs = ToyRuns(tmp_path_factory.mktemp("validated"), toy_model)
    # step 0 (val_at_start), step 2 (val_period and val_at_end), after the last update
    assert runs.run("val", *VALIDATED)["iterations"] == [0, 1, 2]
    return runs


def test_validation_runs_on_nemo_rl_schedule_and_joins_the_checkpoint(validated: ToyRuns):
    assert "validate" in validated.stages("val", 0)
    assert "validate" not in validated.stages("val", 1)
    assert set(validated.stages("val", 2)) == {"validate", "checkpoint"}
    info = validated.run_dir("val") / "checkpoints" / "step_000002" / "training_info.json"
    accuracy = validated.stages("val", 2)["validate"]["metrics"]["accuracy"]
    assert json.loads(info.read_text())["val:accuracy"] == accuracy


def test_a_rerun_is_bit_identical_and_makes_its_readers_stale(validated: ToyRuns) -> None:
    root = str(validated.root)
    recorded = validated.stages("val", 1)
    weights = validated.weights("val", 2)
    for stage in ("answer", "score"):
        outputs = rerun_stage(run_id="val", iteration=1, stage=stage, storage_root=root)
        assert outputs == recorded[stage]["outputs"], stage
    stages = validated.stages("val", 1)
    assert stages["prompts"]["status"] == stages["score"]["status"] == "complete"
    assert stages["update"]["status"] == stages["checkpoint"]["status"] == "stale"
    validated.run("val", *VALIDATED)
    assert all(e["status"] == "complete" for e in validated.stages("val", 1).values())
    assert validated.weights("val", 2) == weights
    # the update recomputed from the same inputs: the same metrics, a new entry
    assert (
        validated.stages("val", 1)["update"]["metrics"]["loss"]
        == (recorded["update"]["metrics"]["loss"])
    )


def test_a_rerun_of_validation_leaves_training_alone(validated: ToyRuns) -> None:
    before = validated.stages("val", 0)
    outputs = rerun_stage(
        run_id="val", iteration=0, stage="validate", storage_root=str(validated.root)
    )
    assert outputs == before["validate"]["outputs"]
    after = validated.stages("val", 0)
    assert after["checkpoint"]["status"] == "stale"
    assert all(after[s]["finished_at"] == before[s]["finished_at"] for s in ("prompts", "update"))


def test_a_finished_run_continued_redoes_nothing(validated: ToyRuns) -> None:
    validated.run("val", *VALIDATED)  # recomputes what earlier tests left stale
    finished = {i: validated.finished_at("val", i) for i in range(3)}
    validated.run("val", *VALIDATED)
    assert {i: validated.finished_at("val", i) for i in range(3)} == finished


def test_a_rerun_of_an_unknown_stage_is_refused(validated: ToyRuns) -> None:
    with pytest.raises(ValueError, match=r"stage 'train' is not one of \['validate', 'prompts'"):
        rerun_stage(run_id="val", iteration=1, stage="train", storage_root=str(validated.root))
