"""The reward stage split into shards (``orchestration.fan_out``): concurrent task runs whose
merged output is the unsplit stage's bit for bit, a failed shard computed alone when the run
continues, and a rerun of the stage computing its shards again."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flows.grpo import grpo
from flows.rerun_stage import rerun_stage
from nemo_rl_core.utils.config import ConfigError
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples/configs/grpo_math_tiny_fast.yaml"
SHARDS = 3
SPLIT = [f"++orchestration.fan_out.reward={SHARDS}"]


def run(root: Path, run_id: str, overrides: list[str]) -> dict:
    return grpo(config_path=str(CONFIG), overrides=overrides, run_id=run_id, storage_root=str(root))


def iteration_dir(root: Path, run_id: str, iteration: int) -> Path:
    return root / "runs" / run_id / f"iter_{iteration:06d}"


def manifest(root: Path, run_id: str, iteration: int) -> dict:
    return json.loads((iteration_dir(root, run_id, iteration) / "MANIFEST.json").read_text())


def shard_entries(root: Path, run_id: str, iteration: int) -> dict[str, dict]:
    folder = iteration_dir(root, run_id, iteration) / "reward"
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.entry.json"))}


def final_weights(root: Path, run_id: str) -> dict:
    return load_file(root / "runs" / run_id / "checkpoints" / "step_000002" / "model.safetensors")


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whole")
    run(root, "whole", [])
    return root


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("split")
    run(root, "split", SPLIT)
    return root


def test_split_reward_is_the_unsplit_stage_bit_for_bit(whole: Path, split: Path) -> None:
    for iteration in (0, 1):
        shards = shard_entries(split, "split", iteration)
        assert sorted(shards) == [f"shard-{i}-of-{SHARDS}.entry.json" for i in range(SHARDS)]
        assert all(entry["status"] == "complete" for entry in shards.values())
        assert shard_entries(whole, "whole", iteration) == {}
        whole_reward = manifest(whole, "whole", iteration)["stages"]["reward"]
        split_reward = manifest(split, "split", iteration)["stages"]["reward"]
        assert (
            split_reward["outputs"]["batch"]["sha256"]
            == (whole_reward["outputs"]["batch"]["sha256"])
        )
        assert split_reward["metrics"]["mean_reward"] == whole_reward["metrics"]["mean_reward"]
    expected, got = final_weights(whole, "whole"), final_weights(split, "split")
    assert all(expected[name].equal(got[name]) for name in expected)


def test_a_failed_shard_is_computed_alone(
    whole: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, f"reward/shard-1-of-{SHARDS}@1")
    with pytest.raises(Exception, match="fault injected"):
        run(tmp_path, "faulty", SPLIT)
    before = shard_entries(tmp_path, "faulty", 1)
    assert sorted(before) == [f"shard-{i}-of-{SHARDS}.entry.json" for i in (0, 2)]
    monkeypatch.delenv(FAULT_ENV)
    run(tmp_path, "faulty", SPLIT)
    after = shard_entries(tmp_path, "faulty", 1)
    assert {name: after[name]["finished_at"] for name in before} == {
        name: entry["finished_at"] for name, entry in before.items()
    }, "a shard that had finished was computed again"
    assert f"shard-1-of-{SHARDS}.entry.json" in after
    expected, got = final_weights(whole, "whole"), final_weights(tmp_path, "faulty")
    assert all(expected[name].equal(got[name]) for name in expected)


def test_a_rerun_of_the_stage_computes_its_shards_again(split: Path) -> None:
    before = manifest(split, "split", 1)["stages"]
    shards_before = shard_entries(split, "split", 1)
    rerun_stage(run_id="split", iteration=1, stage="reward", storage_root=str(split))
    after = manifest(split, "split", 1)["stages"]
    assert after["reward"]["outputs"] == before["reward"]["outputs"]  # bit-identical
    assert after["logprob"]["status"] == "stale"
    shards_after = shard_entries(split, "split", 1)
    for name, entry in shards_after.items():
        assert entry["status"] == "complete"
        assert entry["finished_at"] != shards_before[name]["finished_at"]


def test_a_stage_that_does_not_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"orchestration\.fan_out\.train: .* does not split"):
        run(tmp_path, "refused", ["++orchestration.fan_out.train=2"])
    assert not (tmp_path / "runs" / "refused").exists()
