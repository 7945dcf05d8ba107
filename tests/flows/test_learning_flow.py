"""GRPO on the embedded default learns (tiny-llama-arith learning to carry), in sync and
asynchronously.

Sync: the run `make run` makes, cut to 10 iterations (about a minute once tiny-llama-arith
is built; its first build adds 1-2 more); held-out greedy accuracy rises within them. It
asserts the gain, not the time.

Async: the rollouts of the next steps run while a step trains, from weights at most
``max_trajectory_age_steps`` old, which the manifest names; the loss's importance-sampling
correction weighs the stale samples; and the reward rises as in the sync run (the same
module run: validation samples on a seed stream of its own, so the training rewards are
those of a run without it). The run-ahead rules (a failed rollout ahead continued, a rerun
lagged stage, the checkpoints kept for rollouts in flight) are
tests/orchestration/test_run_ahead.py's.
"""

import json
import statistics
from pathlib import Path

import pytest

from flows.grpo import grpo

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_addition_tiny.yaml"
STEPS = 10
AGE = 2
QUIET = ["grpo.val_at_start=false", "grpo.val_at_end=false", "grpo.val_period=0"]
ASYNC = [
    "grpo.async_grpo.enabled=true",
    f"grpo.async_grpo.max_trajectory_age_steps={AGE}",
    "loss_fn.use_importance_sampling_correction=true",
]


def run(root: Path, run_id: str, extra: list[str]) -> dict:
    overrides = [f"grpo.max_num_steps={STEPS}", *extra]
    return grpo(config_path=str(CONFIG), overrides=overrides, run_id=run_id, storage_root=str(root))


def stages(root: Path, run_id: str, iteration: int) -> dict:
    path = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sync run ``learn``, validated at its start and its end: both tests read it."""
    path = tmp_path_factory.mktemp("learning")
    run(path, "learn", [f"grpo.val_period={STEPS}"])
    return path


def test_held_out_greedy_accuracy_rises_by_15_points(root: Path) -> None:
    def greedy_accuracy(iteration: int) -> float:
        return stages(root, "learn", iteration)["validate"]["metrics"]["greedy_accuracy"]

    start, end = greedy_accuracy(0), greedy_accuracy(STEPS)
    assert 0.1 <= start <= 0.6, f"the warm start should be partly right, got {start:.3f}"
    assert end - start >= 0.15, f"greedy accuracy {start:.3f} -> {end:.3f} after {STEPS} steps"


def test_reward_rises_as_in_sync_from_weights_at_most_the_age_bound_old(root: Path) -> None:
    run(root, "async", [*QUIET, *ASYNC])
    for iteration in range(STEPS):
        generate = stages(root, "async", iteration)["generate"]
        step = int(generate["inputs"]["policy_step"])
        assert step == max(0, iteration - AGE), (iteration, step)
        assert generate["metrics"]["weights_step"] == step
        train = stages(root, "async", iteration)["train"]
        # the loss weighed the stale samples by pi_old / pi_gen: not all of them were 1
        assert train["metrics"]["sampling_importance_ratio"] != 1.0 or step == iteration

    def rewards(run_id: str) -> list[float]:
        return [stages(root, run_id, i)["reward"]["metrics"]["mean_reward"] for i in range(STEPS)]

    sync, overlapped = rewards("learn"), rewards("async")
    gain = {
        name: statistics.mean(r[-3:]) - statistics.mean(r[:3])
        for name, r in (("sync", sync), ("async", overlapped))
    }
    assert gain["sync"] > 0.05, sync
    assert gain["async"] >= 0.5 * gain["sync"], (sync, overlapped)
