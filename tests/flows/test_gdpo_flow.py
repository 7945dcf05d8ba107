"""GDPO end to end on the embedded default (examples/configs/gdpo_math_tiny.yaml): the
multi-reward math environment's three rewards reach the advantage stage as reward1..3, and
the stage computes GDPO's advantages from them, not GRPO's from their sum."""

import json
from pathlib import Path

import pytest
import torch

from flows.grpo import grpo
from nemo_rl_core.algorithms.advantage_estimator import (
    GDPOAdvantageEstimator,
    GRPOAdvantageEstimator,
)
from nemo_rl_core.algorithms.grpo import compute_advantages
from nemo_rl_core.algorithms.grpo_config import load_master_config
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.storage.handles import RunRef, open_storage

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "gdpo_math_tiny.yaml"
COMPONENTS = ["reward1", "reward2", "reward3"]


def stage_batch(root: Path, stage: str, iteration: int = 0) -> BatchedDataDict:
    manifest = root / "runs" / "gdpo" / f"iter_{iteration:06d}" / "MANIFEST.json"
    entry = json.loads(manifest.read_text())["stages"][stage]["outputs"]
    storage = open_storage(RunRef(str(root), "gdpo"))
    return storage.read_batch(StageRef.from_dict(entry).outputs["batch"])


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gdpo")
    summary = grpo(config_path=str(CONFIG), overrides=[], run_id="gdpo", storage_root=str(root))
    assert summary["iterations"] == [0, 1]
    return root


def test_the_three_rewards_reach_the_advantage_stage(run_root: Path) -> None:
    scored = stage_batch(run_root, "reward")
    components = torch.stack([scored[key] for key in COMPONENTS], dim=1)
    assert components.shape == (len(scored["total_reward"]), 3)
    assert torch.equal(scored["total_reward"], components.sum(dim=1))
    inputs = stage_batch(run_root, "logprob")
    for key in ["total_reward", *COMPONENTS]:
        assert torch.equal(inputs[key], scored[key]), key
    advantages = stage_batch(run_root, "advantage")["advantages"]
    assert torch.isfinite(advantages).all()


def test_the_advantage_stage_normalises_each_component(run_root: Path) -> None:
    """The stage's computation on the stored inputs with rewards that tell the estimators
    apart: each component's spread counts on its own (GDPO), not only their sum's (GRPO)."""
    config = load_master_config(str(CONFIG), [])
    inputs = stage_batch(run_root, "logprob")
    size = len(inputs["total_reward"])
    gen = torch.Generator().manual_seed(0)
    for key, scale in zip(COMPONENTS, (1.0, 0.01, 5.0), strict=True):
        inputs[key] = torch.randint(0, 2, (size,), generator=gen).float() * scale
    inputs["total_reward"] = sum(inputs[key] for key in COMPONENTS)
    got, _ = compute_advantages(inputs, config)
    settings = config.grpo.resolved_adv_estimator()
    mask = inputs["token_mask"]
    prompts = inputs["prompt_index"]
    gdpo = GDPOAdvantageEstimator(settings).compute_advantage(
        prompts, None, mask, {key: inputs[key] for key in COMPONENTS}
    )
    grpo_of_sum = GRPOAdvantageEstimator(settings).compute_advantage(
        prompts, inputs["total_reward"], mask
    )
    torch.testing.assert_close(got["advantages"], gdpo)
    assert not torch.allclose(gdpo, grpo_of_sum)
