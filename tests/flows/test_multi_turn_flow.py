"""Multi-turn GRPO (the sliding puzzle, several turns per episode): a failed generate stage
resumed, and a rerun of generate, give exactly what the uninterrupted run gave."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flows.grpo import grpo
from flows.rerun_stage import rerun_stage
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
ITERATIONS = 2
# As NeMo RL's puzzle config: no data.train, the games come from the environment's settings.
OVERRIDES = [
    f"grpo.max_num_steps={ITERATIONS}",
    "grpo.max_rollout_turns=3",
    "data.train=null",
    "data.validation=null",
    "data.default=null",
    "policy.generation.max_new_tokens=16",
    "policy.max_total_sequence_length=512",
    "+env.sliding_puzzle_game.cfg.max_moves=3",
    "+env.sliding_puzzle_game.cfg.game_config.size=2",
]


def run(config: Path, root: Path, run_id: str) -> None:
    grpo(config_path=str(config), overrides=OVERRIDES, run_id=run_id, storage_root=str(root))


def weights(root: Path, run_id: str) -> dict:
    step = f"step_{ITERATIONS:06d}"
    return load_file(root / "runs" / run_id / "checkpoints" / step / "model.safetensors")


def generate_entry(root: Path, run_id: str, iteration: int) -> dict:
    manifest = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(manifest.read_text())["stages"]["generate"]


@pytest.fixture(scope="module")
def clean(tiny_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("storage")
    run(tiny_config, root, "clean")
    return root


def test_episodes_have_several_turns(clean):
    metrics = generate_entry(clean, "clean", 1)["metrics"]
    assert metrics["avg_turns_per_sample"] > 1


def test_failed_generate_resumes_to_identical_weights(clean, tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "generate@1")
    with pytest.raises(Exception, match="fault injected into stage 'generate' of iteration 1"):
        run(tiny_config, tmp_path, "faulty")
    monkeypatch.delenv(FAULT_ENV)
    run(tiny_config, tmp_path, "faulty")
    assert (
        generate_entry(tmp_path, "faulty", 1)["outputs"]
        == generate_entry(clean, "clean", 1)["outputs"]
    )
    expected, got = weights(clean, "clean"), weights(tmp_path, "faulty")
    assert all(expected[name].equal(got[name]) for name in expected)


def test_rerun_of_generate_is_bit_identical(clean):
    before = generate_entry(clean, "clean", 1)["outputs"]["batch"]["sha256"]
    rerun_stage(run_id="clean", iteration=1, stage="generate", storage_root=str(clean))
    assert generate_entry(clean, "clean", 1)["outputs"]["batch"]["sha256"] == before
