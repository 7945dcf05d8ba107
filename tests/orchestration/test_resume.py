"""Resume and continue: a failed run continues at its failed stage and ends with the
uninterrupted run's weights, byte for byte; complete stages are skipped; a run stopped after
its checkpoint committed finishes that iteration; a finished run says so, and
``max_num_steps`` continues it."""

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from toy_pipeline import INITIAL_WEIGHTS
from toy_runs import ToyRuns

from nemo_rl_core.utils.config import ConfigError
from tasks.faults import FAULT_ENV

STEPS = 3


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, toy_model) -> ToyRuns:
    runs = ToyRuns(tmp_path_factory.mktemp("clean"), toy_model)
    summary = runs.run("clean")
    assert summary["iterations"] == list(range(STEPS))
    return runs


def test_a_run_writes_every_stage_and_checkpoint_and_learns(clean: ToyRuns) -> None:
    for iteration in range(STEPS):
        stages = clean.stages("clean", iteration)
        assert sorted(stages) == ["answer", "checkpoint", "prompts", "score", "update"]
        assert all(entry["status"] == "complete" for entry in stages.values())
    losses = [clean.stages("clean", i)["update"]["metrics"]["loss"] for i in range(STEPS)]
    assert losses[-1] < losses[0], losses
    assert clean.weights("clean", 1) != clean.weights("clean", STEPS)
    assert INITIAL_WEIGHTS  # the run starts from them (write_initial_model)


def test_a_failed_stage_continues_there_to_the_same_weights(
    clean: ToyRuns, toy: ToyRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "score@1")
    with pytest.raises(Exception, match="fault injected into stage 'score' of iteration 1"):
        toy.run("faulty")
    before = toy.finished_at("faulty", 1)
    assert sorted(before) == ["answer", "prompts"]
    monkeypatch.delenv(FAULT_ENV)
    assert toy.run("faulty")["iterations"] == [1, 2]
    after = toy.finished_at("faulty", 1)
    assert {name: after[name] for name in before} == before, "a complete stage was recomputed"
    assert toy.weights("faulty", STEPS) == clean.weights("clean", STEPS)


def test_a_run_stopped_after_its_commit_finishes_that_iteration(
    clean: ToyRuns, toy: ToyRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "checkpoint@1")
    with pytest.raises(Exception, match="fault injected into stage 'checkpoint'"):
        toy.run("cut")
    assert (toy.run_dir("cut") / "checkpoints" / "step_000002" / "COMMITTED").is_file()
    update = toy.finished_at("cut", 1)["update"]
    monkeypatch.delenv(FAULT_ENV)
    assert toy.run("cut")["iterations"] == [1, 2]
    assert toy.finished_at("cut", 1)["update"] == update
    assert toy.weights("cut", STEPS) == clean.weights("clean", STEPS)


def test_a_finished_run_says_so_and_max_num_steps_continues_it(clean: ToyRuns) -> None:
    finished = {i: clean.finished_at("clean", i) for i in range(STEPS)}
    state = clean.run("clean", return_state=True)
    assert state.is_completed()
    assert f"run clean is finished: all {STEPS} steps are committed" in state.message
    assert "toy.max_num_steps" in state.message
    assert state.result()["iterations"] == []
    with get_client(sync_client=True) as client:  # by key: the server is shared
        said = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["clean-nothing-to-do"]))
        )
    assert said, "no 'clean-nothing-to-do' artifact"
    assert {i: clean.finished_at("clean", i) for i in range(STEPS)} == finished

    assert clean.run("clean", max_num_steps=STEPS + 1)["iterations"] == [STEPS]
    assert clean.run("clean", "toy.max_num_steps=6", steps_per_run=1)["iterations"] == [4]


def test_a_continue_with_other_data_or_model_is_refused(
    clean: ToyRuns, toy: ToyRuns, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with pytest.raises(ConfigError, match="run 'clean' was started with a different data"):
        clean.run("clean", "data.train.seed=2")
    other = ToyRuns(clean.root, tmp_path_factory.mktemp("other-model"))
    from toy_pipeline import write_initial_model

    write_initial_model(other.model)
    with pytest.raises(ConfigError, match="different policy.model_name"):
        other.run("clean")
