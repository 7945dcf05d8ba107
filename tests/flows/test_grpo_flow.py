"""End to end: the GRPO flow on the embedded default (no server, local storage)."""

import json
import math
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flows.grpo import grpo
from flows.rerun_stage import rerun_stage
from nemo_rl_core.pipeline.algorithms import GRPO
from tasks.faults import FAULT_ENV

# The stages of a training iteration (validation is off in these configs).
TRAINING_STAGES = [name for name in GRPO.stage_names if name != "validate"]
pytestmark = pytest.mark.e2e
ITERATIONS = 3
FAULTY = 1  # the resumed run starts on a fresh engine and still samples what a warm one did


def final_weights(root: Path, run_id: str) -> dict:
    step_dir = root / "runs" / run_id / "checkpoints" / f"step_{ITERATIONS:06d}"
    return load_file(step_dir / "model.safetensors")


def manifest(root: Path, run_id: str, iteration: int) -> dict:
    return json.loads(
        (root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json").read_text()
    )


@pytest.fixture(scope="module")
def uninterrupted(tiny_config: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("storage")
    summary = grpo(
        config_path=str(tiny_config),
        overrides=[f"grpo.max_num_steps={ITERATIONS}"],
        run_id="clean",
        storage_root=str(root),
    )
    return root, summary


def test_writes_the_design_layout_and_finite_metrics(uninterrupted):
    root, summary = uninterrupted
    run_dir = root / "runs" / "clean"
    assert (run_dir / "config.yaml").is_file()
    assert summary["iterations"] == list(range(ITERATIONS))
    for iteration in range(ITERATIONS):
        entry = manifest(root, "clean", iteration)["stages"]
        assert set(entry) == set(TRAINING_STAGES)
        for stage in ("prompts", "generate", "reward", "logprob", "advantage"):
            assert (run_dir / f"iter_{iteration:06d}" / stage / "batch.arrow").is_file()
        assert (run_dir / f"iter_{iteration:06d}" / "train" / "metrics.json").is_file()
    for step in range(1, ITERATIONS + 1):
        assert (run_dir / "checkpoints" / f"step_{step:06d}" / "COMMITTED").is_file()
    for metrics in summary["metrics"]:
        for key in ("reward/mean_reward", "train/loss"):
            assert math.isfinite(metrics[key]), (key, metrics)


def test_failed_stage_resumes_to_identical_weights(
    uninterrupted, tiny_config, tmp_path, monkeypatch
):
    clean_root, _ = uninterrupted
    overrides = [f"grpo.max_num_steps={ITERATIONS}"]
    monkeypatch.setenv(FAULT_ENV, f"reward@{FAULTY}")
    with pytest.raises(
        Exception, match=f"fault injected into stage 'reward' of iteration {FAULTY}"
    ):
        grpo(
            config_path=str(tiny_config),
            overrides=overrides,
            run_id="faulty",
            storage_root=str(tmp_path),
        )
    before = manifest(tmp_path, "faulty", FAULTY)["stages"]
    assert set(before) == {"prompts", "generate"}
    monkeypatch.delenv(FAULT_ENV)
    grpo(
        config_path=str(tiny_config),
        overrides=overrides,
        run_id="faulty",
        storage_root=str(tmp_path),
    )
    after = manifest(tmp_path, "faulty", FAULTY)["stages"]
    for stage in ("prompts", "generate"):
        assert after[stage]["finished_at"] == before[stage]["finished_at"], (
            f"{stage} was recomputed"
        )
    clean, resumed = final_weights(clean_root, "clean"), final_weights(tmp_path, "faulty")
    assert clean.keys() == resumed.keys()
    for name in clean:
        assert clean[name].equal(resumed[name]), name


def test_rerun_one_stage_is_bit_identical_and_marks_later_stale(uninterrupted, tiny_config):
    root, _ = uninterrupted
    original = manifest(root, "clean", 1)["stages"]
    for stage in ("generate", "reward"):  # generate on a fresh engine samples the same tokens
        outputs = rerun_stage(run_id="clean", iteration=1, stage=stage, storage_root=str(root))
        assert outputs["batch"]["sha256"] == original[stage]["outputs"]["batch"]["sha256"], stage
    stages = manifest(root, "clean", 1)["stages"]
    assert stages["reward"]["status"] == "complete"
    assert all(
        stages[s]["status"] == "stale" for s in ("logprob", "advantage", "train", "checkpoint")
    )
    before = final_weights(root, "clean")
    grpo(
        config_path=str(tiny_config),
        overrides=[f"grpo.max_num_steps={ITERATIONS}"],
        run_id="clean",
        storage_root=str(root),
    )
    stages = manifest(root, "clean", 1)["stages"]
    assert all(stages[s]["status"] == "complete" for s in TRAINING_STAGES)
    after = final_weights(root, "clean")
    for name in before:
        assert before[name].equal(after[name]), name


def test_verify_finds_damage_a_continue_would_not_look_at(uninterrupted, tmp_path):
    from flows.verify import verify_run

    root, _ = uninterrupted
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert verify_run(run_id="clean", storage_root=str(copy)).intact
    weights = (
        copy / "runs" / "clean" / "checkpoints" / f"step_{ITERATIONS:06d}" / "model.safetensors"
    )
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    state = verify_run(run_id="clean", storage_root=str(copy), return_state=True)
    assert state.is_failed()
    assert f"step_{ITERATIONS:06d}/model.safetensors has sha256" in state.message
