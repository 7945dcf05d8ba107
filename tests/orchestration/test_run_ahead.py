"""Run-ahead (asynchronous GRPO's ``RunAhead``): the rollout stages of the next iterations
run while one trains, the lagged one from the weights ``depth`` steps older (never before
step 0), which its manifest entry names; a run whose rollout ahead failed continues to the
uninterrupted weights, and a rerun of a lagged stage reads the same old weights."""

import pytest
from toy_runs import ToyRuns

from flows.rerun_stage import rerun_stage
from tasks.faults import FAULT_ENV

STEPS = 5
DEPTH = 2
AHEAD = (f"toy.max_num_steps={STEPS}", f"toy.run_ahead_steps={DEPTH}")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, toy_model) -> ToyRuns:
    runs = ToyRuns(tmp_path_factory.mktemp("ahead"), toy_model)
    runs.run("clean", *AHEAD)
    return runs


def test_each_answer_reads_weights_at_most_depth_steps_old(clean: ToyRuns) -> None:
    for iteration in range(STEPS):
        answer = clean.stages("clean", iteration)["answer"]
        step = int(answer["inputs"]["policy_step"])
        assert step == max(0, iteration - DEPTH), (iteration, step)
        assert answer["metrics"]["weights_step"] == step
        assert clean.stages("clean", iteration)["update"]["status"] == "complete"


def test_checkpoints_the_rollouts_ahead_read_are_kept(toy: ToyRuns) -> None:
    toy.run("kept", *AHEAD, "checkpointing.keep_top_k=1")
    kept = toy.stages("kept", STEPS - 1)["checkpoint"]["metrics"]["checkpoints_kept"]
    assert kept == DEPTH + 1


def test_a_failed_rollout_ahead_continues_to_the_same_weights(
    clean: ToyRuns, toy: ToyRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    # answer@3 runs in the background thread while iteration 2 (or 1) updates
    monkeypatch.setenv(FAULT_ENV, "answer@3")
    with pytest.raises(Exception, match="fault injected into stage 'answer' of iteration 3"):
        toy.run("faulty", *AHEAD)
    assert "update" not in toy.stages("faulty", 3)
    monkeypatch.delenv(FAULT_ENV)
    toy.run("faulty", *AHEAD)
    assert toy.weights("faulty", STEPS) == clean.weights("clean", STEPS)


def test_a_rerun_of_a_lagged_stage_reads_the_same_weights(clean: ToyRuns) -> None:
    iteration = 4
    before = clean.stages("clean", iteration)["answer"]
    outputs = rerun_stage(
        run_id="clean", iteration=iteration, stage="answer", storage_root=str(clean.root)
    )
    assert outputs == before["outputs"]
    assert clean.stages("clean", iteration)["answer"]["inputs"] == before["inputs"]
    weights = clean.weights("clean", STEPS)
    clean.run("clean", *AHEAD)
    assert all(e["status"] == "complete" for e in clean.stages("clean", iteration).values())
    assert clean.weights("clean", STEPS) == weights
