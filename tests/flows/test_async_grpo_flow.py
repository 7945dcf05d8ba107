"""Asynchronous GRPO on the embedded default (tiny-llama-arith learning to carry): the
rollouts of the next steps run while a step trains, from weights at most
``max_trajectory_age_steps`` old; the manifest names the checkpoint each batch came from,
so a resumed run and a rerun stage end bit-identical; and the reward rises as in sync."""

import json
import statistics
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flows.grpo import grpo
from flows.rerun_stage import rerun_stage
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_addition_tiny.yaml"
STEPS = 6
AGE = 2
QUIET = ["grpo.val_at_start=false", "grpo.val_at_end=false", "grpo.val_period=0"]
ASYNC = [
    "grpo.async_grpo.enabled=true",
    f"grpo.async_grpo.max_trajectory_age_steps={AGE}",
    "loss_fn.use_importance_sampling_correction=true",
]


def run(root: Path, run_id: str, extra: list[str], steps: int = STEPS) -> dict:
    overrides = [f"grpo.max_num_steps={steps}", *QUIET, *extra]
    return grpo(config_path=str(CONFIG), overrides=overrides, run_id=run_id, storage_root=str(root))


def stages(root: Path, run_id: str, iteration: int) -> dict:
    path = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


def final_weights(root: Path, run_id: str, steps: int = STEPS) -> dict:
    return load_file(root / "runs" / run_id / "checkpoints" / f"step_{steps:06d}/model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), name


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, every checkpoint kept: a rerun stage reads the one its batch
    was generated from (the config's keep_top_k=1 keeps only the newest AGE + 1)."""
    root = tmp_path_factory.mktemp("async")
    run(root, "clean", [*ASYNC, "checkpointing.keep_top_k=null"])
    return root


def test_each_batch_records_weights_at_most_the_age_bound_old(clean: Path):
    for iteration in range(STEPS):
        generate = stages(clean, "clean", iteration)["generate"]
        step = int(generate["inputs"]["policy_step"])
        assert step == max(0, iteration - AGE), (iteration, step)
        assert 0 <= iteration - step <= AGE
        assert generate["metrics"]["weights_step"] == step
        train = stages(clean, "clean", iteration)["train"]
        assert train["status"] == "complete"
        # the loss weighed the stale samples by pi_old / pi_gen: not all of them were 1
        assert train["metrics"]["sampling_importance_ratio"] != 1.0 or step == iteration


def test_resume_after_a_failed_rollout_ahead_is_bit_identical(clean: Path, tmp_path, monkeypatch):
    # generate@3 runs in the background thread while iteration 2 (or 1) trains
    monkeypatch.setenv(FAULT_ENV, "generate@3")
    with pytest.raises(Exception, match="fault injected into stage 'generate' of iteration 3"):
        run(tmp_path, "faulty", ASYNC)
    assert "train" not in stages(tmp_path, "faulty", 3)
    monkeypatch.delenv(FAULT_ENV)
    run(tmp_path, "faulty", ASYNC)
    assert_same_weights(final_weights(clean, "clean"), final_weights(tmp_path, "faulty"))


def test_rerun_of_a_lagged_generate_is_bit_identical(clean: Path):
    iteration = 4
    before = stages(clean, "clean", iteration)["generate"]
    outputs = rerun_stage(
        run_id="clean", iteration=iteration, stage="generate", storage_root=str(clean)
    )
    assert outputs["batch"]["sha256"] == before["outputs"]["batch"]["sha256"]
    assert stages(clean, "clean", iteration)["generate"]["inputs"] == before["inputs"]
    weights = final_weights(clean, "clean")
    run(
        clean, "clean", [*ASYNC, "checkpointing.keep_top_k=null"]
    )  # the stale later stages of iteration 4 on recompute
    assert all(e["status"] == "complete" for e in stages(clean, "clean", iteration).values())
    assert_same_weights(weights, final_weights(clean, "clean"))


def test_reward_rises_as_in_sync(tmp_path: Path):
    steps = 10
    run(tmp_path, "sync", [], steps)
    run(tmp_path, "async", ASYNC, steps)

    def rewards(run_id: str) -> list[float]:
        return [
            stages(tmp_path, run_id, i)["reward"]["metrics"]["mean_reward"] for i in range(steps)
        ]

    sync, overlapped = rewards("sync"), rewards("async")
    gain = {
        name: statistics.mean(r[-3:]) - statistics.mean(r[:3])
        for name, r in (("sync", sync), ("async", overlapped))
    }
    assert gain["sync"] > 0.05, sync
    assert gain["async"] >= 0.5 * gain["sync"], (sync, overlapped)
