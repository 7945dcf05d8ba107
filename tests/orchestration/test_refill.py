"""Refill (DAPO's dynamic sampling, ``Refill``): rounds recorded as ``score.1``, ``score.2``
until a step's batch is full, each from its own prompts; a fault inside a refill round
continues to the uninterrupted weights; a rerun of the first round makes the later rounds
stale. The toy keeps the problems whose sum is even, about half of each round."""

import pytest
from toy_runs import ToyRuns

from flows.rerun_stage import rerun_stage
from tasks.faults import FAULT_ENV

REFILL = ("toy.refill=true",)
STEPS = 3


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, toy_model) -> ToyRuns:
    runs = ToyRuns(tmp_path_factory.mktemp("clean"), toy_model)
    runs.run("clean", *REFILL)
    return runs


def test_refill_rounds_fill_the_step_batch(clean: ToyRuns) -> None:
    refills = 0
    for iteration in range(STEPS):
        recorded = clean.stages("clean", iteration)
        rounds = sorted(name for name in recorded if name.startswith("score"))
        refills += len(rounds) - 1
        for name in rounds[1:]:  # each round drew and answered its own problems
            suffix = name.partition(".")[2]
            assert {f"prompts.{suffix}", f"answer.{suffix}"} <= set(recorded)
        kept = [recorded[name]["metrics"]["kept"] for name in rounds]
        assert kept[-1] == 4 and all(count < 4 for count in kept[:-1]), kept
        assert recorded["update"]["status"] == "complete"
    assert refills > 0, "no refill round happened: the test would not test refills"
    # the next iteration draws where the last round left the loader
    first = clean.stages("clean", 1)["prompts"]["inputs"]["dataloader_version"]
    assert first != clean.stages("clean", 0)["prompts"]["inputs"]["dataloader_version"]


def test_a_fault_in_a_refill_round_continues_to_the_same_weights(
    clean: ToyRuns, toy: ToyRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    iteration, name = next(
        (i, name)
        for i in range(STEPS)
        for name in clean.stages("clean", i)
        if name.startswith("answer.")
    )
    monkeypatch.setenv(FAULT_ENV, f"{name}@{iteration}")
    with pytest.raises(Exception, match="fault injected"):
        toy.run("faulty", *REFILL)
    monkeypatch.delenv(FAULT_ENV)
    toy.run("faulty", *REFILL)
    assert toy.weights("faulty", STEPS) == clean.weights("clean", STEPS)
    assert toy.stages("faulty", iteration).keys() == clean.stages("clean", iteration).keys()


def test_a_rerun_of_the_first_round_makes_the_later_rounds_stale(clean: ToyRuns) -> None:
    iteration = next(i for i in range(STEPS) if "score.1" in clean.stages("clean", i))
    before = clean.stages("clean", iteration)
    rerun_stage(run_id="clean", iteration=iteration, stage="score", storage_root=str(clean.root))
    after = clean.stages("clean", iteration)
    assert after["score"]["outputs"] == before["score"]["outputs"]  # bit-identical
    assert after["score.1"]["status"] == "stale" and after["update"]["status"] == "stale"
    assert after["prompts"]["status"] == after["answer"]["status"] == "complete"
    assert after["prompts.1"]["status"] == "stale"  # a later round draws where this one left
    weights = clean.weights("clean", STEPS)
    clean.run("clean", *REFILL)
    assert all(e["status"] == "complete" for e in clean.stages("clean", iteration).values())
    assert clean.weights("clean", STEPS) == weights
