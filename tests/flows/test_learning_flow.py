"""GRPO on the embedded default learns: held-out greedy accuracy rises within 10 steps.

The run `make run` makes, cut to 10 iterations (about a minute once tiny-llama-arith is
built; its first build adds 1-2 more). It asserts the gain, not the time.
"""

import json
from pathlib import Path

import pytest

from flows.grpo import grpo

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_addition_tiny.yaml"
STEPS = 10


def greedy_accuracy(root: Path, run_id: str, iteration: int) -> float:
    manifest = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(manifest.read_text())["stages"]["validate"]["metrics"]["greedy_accuracy"]


def test_held_out_greedy_accuracy_rises_by_15_points(tmp_path: Path):
    overrides = [f"grpo.max_num_steps={STEPS}", f"grpo.val_period={STEPS}"]
    grpo(config_path=str(CONFIG), overrides=overrides, run_id="learn", storage_root=str(tmp_path))
    start = greedy_accuracy(tmp_path, "learn", 0)
    end = greedy_accuracy(tmp_path, "learn", STEPS)
    assert 0.1 <= start <= 0.6, f"the warm start should be partly right, got {start:.3f}"
    assert end - start >= 0.15, f"greedy accuracy {start:.3f} -> {end:.3f} after {STEPS} steps"
