"""A stage split into shards (``orchestration.fan_out``): concurrent task runs whose merged
output is the unsplit stage's bit for bit; a failed shard is computed alone when the run
continues; a rerun of the stage computes its shards again; a stage that does not split is
refused before any work."""

import json
from pathlib import Path

import pytest
from toy_runs import ToyRuns

from flows.rerun_stage import rerun_stage
from nemo_rl_core.utils.config import ConfigError
from tasks.faults import FAULT_ENV

SHARDS = 3
SPLIT = (f"++orchestration.fan_out.score={SHARDS}",)
STEPS = 3


def shard_entries(runs: ToyRuns, run_id: str, iteration: int) -> dict[str, dict]:
    folder = runs.run_dir(run_id) / f"iter_{iteration:06d}" / "score"
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.entry.json"))}


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, toy_model: Path) -> ToyRuns:
    runs = ToyRuns(tmp_path_factory.mktemp("whole"), toy_model)
    runs.run("whole")
    return runs


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory, toy_model: Path) -> ToyRuns:
    runs = ToyRuns(tmp_path_factory.mktemp("split"), toy_model)
    runs.run("split", *SPLIT)
    return runs


def test_the_split_stage_is_the_unsplit_one_bit_for_bit(whole: ToyRuns, split: ToyRuns) -> None:
    for iteration in range(STEPS):
        shards = shard_entries(split, "split", iteration)
        assert sorted(shards) == [f"shard-{i}-of-{SHARDS}.entry.json" for i in range(SHARDS)]
        assert all(entry["status"] == "complete" for entry in shards.values())
        assert shard_entries(whole, "whole", iteration) == {}
        merged = split.stages("split", iteration)["score"]
        unsplit = whole.stages("whole", iteration)["score"]
        assert merged["outputs"]["batch"]["sha256"] == unsplit["outputs"]["batch"]["sha256"]
        assert merged["metrics"]["mean_reward"] == unsplit["metrics"]["mean_reward"]
    assert split.weights("split", STEPS) == whole.weights("whole", STEPS)


def test_a_failed_shard_is_computed_alone(
    whole: ToyRuns, toy: ToyRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, f"score/shard-1-of-{SHARDS}@1")
    with pytest.raises(Exception, match="fault injected"):
        toy.run("faulty", *SPLIT)
    before = shard_entries(toy, "faulty", 1)
    assert sorted(before) == [f"shard-{i}-of-{SHARDS}.entry.json" for i in (0, 2)]
    monkeypatch.delenv(FAULT_ENV)
    toy.run("faulty", *SPLIT)
    after = shard_entries(toy, "faulty", 1)
    assert {name: after[name]["finished_at"] for name in before} == {
        name: entry["finished_at"] for name, entry in before.items()
    }, "a shard that had finished was computed again"
    assert f"shard-1-of-{SHARDS}.entry.json" in after
    assert toy.weights("faulty", STEPS) == whole.weights("whole", STEPS)


def test_a_rerun_of_the_stage_computes_its_shards_again(split: ToyRuns) -> None:
    before = split.stages("split", 1)
    shards_before = shard_entries(split, "split", 1)
    rerun_stage(run_id="split", iteration=1, stage="score", storage_root=str(split.root))
    after = split.stages("split", 1)
    assert after["score"]["outputs"] == before["score"]["outputs"]  # bit-identical
    assert after["update"]["status"] == "stale"
    for name, entry in shard_entries(split, "split", 1).items():
        assert entry["status"] == "complete"
        assert entry["finished_at"] != shards_before[name]["finished_at"]


def test_a_stage_that_does_not_split_is_refused(toy: ToyRuns) -> None:
    with pytest.raises(ConfigError, match=r"orchestration\.fan_out\.update: .* does not split"):
        toy.run("refused", "++orchestration.fan_out.update=2")
    assert not toy.run_dir("refused").exists()
