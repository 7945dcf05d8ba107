"""End to end: the PPO flow (value stage, GAE, value training) on the embedded default."""

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flows.ppo import ppo
from nemo_rl_core.pipeline.algorithms import PPO
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
ITERATIONS = 2
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "ppo_tiny.yaml"
OVERRIDES = [f"ppo.max_num_steps={ITERATIONS}"]


def final_checkpoint(root: Path, run_id: str) -> Path:
    return root / "runs" / run_id / "checkpoints" / f"step_{ITERATIONS:06d}"


def manifest(root: Path, run_id: str, iteration: int) -> dict:
    return json.loads(
        (root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json").read_text()
    )


def run_ppo(root: Path, run_id: str) -> dict:
    overrides = [*OVERRIDES, f"logger.log_dir={root / 'logs'}"]  # not into the checkout
    return ppo(config_path=str(CONFIG), overrides=overrides, run_id=run_id, storage_root=str(root))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("storage")
    return root, run_ppo(root, "clean")


def test_writes_values_and_commits_the_value_model(uninterrupted):
    root, summary = uninterrupted
    run_dir = root / "runs" / "clean"
    assert summary["iterations"] == list(range(ITERATIONS))
    for iteration in range(ITERATIONS):
        assert set(manifest(root, "clean", iteration)["stages"]) == set(PPO.stage_names) - {
            "validate"
        }
        for stage in ("prompts", "generate", "reward", "logprob", "value", "advantage"):
            assert (run_dir / f"iter_{iteration:06d}" / stage / "batch.arrow").is_file()
    for step in range(1, ITERATIONS + 1):
        step_dir = run_dir / "checkpoints" / f"step_{step:06d}"
        assert (step_dir / "COMMITTED").is_file()
        assert (step_dir / "value" / "model.safetensors").is_file()
        assert (step_dir / "value" / "optimizer").is_dir()
        info = json.loads((step_dir / "training_info.json").read_text())
        assert info["model_sha256"]["value"] != info["model_sha256"]["policy"]
    for metrics in summary["metrics"]:
        for key in ("reward/mean_reward", "train/loss", "train/value_loss"):
            assert math.isfinite(metrics[key]), (key, metrics)
        # Both models really update (scaled rewards are -1/+1, not a constant 0), so the
        # bit-exact resume comparison below compares trained weights.
        assert metrics["train/grad_norm"] > 0 and metrics["train/value_grad_norm"] > 0, metrics


def test_value_fault_resumes_to_identical_policy_and_value(uninterrupted, tmp_path, monkeypatch):
    clean_root, _ = uninterrupted
    monkeypatch.setenv(FAULT_ENV, "value@1")
    with pytest.raises(Exception, match="fault injected into stage 'value' of iteration 1"):
        run_ppo(tmp_path, "faulty")
    before = manifest(tmp_path, "faulty", 1)["stages"]
    assert set(before) == {"prompts", "generate", "reward", "logprob"}
    monkeypatch.delenv(FAULT_ENV)
    run_ppo(tmp_path, "faulty")
    after = manifest(tmp_path, "faulty", 1)["stages"]
    for stage in before:
        assert after[stage]["finished_at"] == before[stage]["finished_at"], stage
    clean, resumed = final_checkpoint(clean_root, "clean"), final_checkpoint(tmp_path, "faulty")
    for weights in ("model.safetensors", "value/model.safetensors"):
        expected, got = load_file(clean / weights), load_file(resumed / weights)
        assert expected.keys() == got.keys()
        for name in expected:
            assert expected[name].equal(got[name]), (weights, name)
