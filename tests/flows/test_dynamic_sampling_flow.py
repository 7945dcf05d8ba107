"""DAPO's dynamic sampling in the GRPO flow: refill rounds recorded in the manifest, a step's
batch filled to size, and a fault inside a refill round resumed bit-identically.

Rewards come from an environment registered here (NeMo RL's ``register_env``): the parity of
the last generated token, so that a random model's prompt groups sometimes all agree and
are dropped, which makes the refill rounds happen.
"""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from flows.grpo import grpo
from flows.rerun_stage import rerun_stage
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.environments.utils import register_env
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
ITERATIONS = 2


class LastTokenParityEnvironment(EnvironmentInterface):
    """Reward 1 when the response's last token id is even."""

    def __init__(self, config: Any = None) -> None:
        pass

    def step(self, message_log_batch, metadata, *args, **kwargs) -> EnvironmentReturn:
        rewards = [
            float(int(log[-1]["token_ids"][-1]) % 2 == 0) if len(log[-1]["token_ids"]) else 0.0
            for log in message_log_batch
        ]
        size = len(rewards)
        return EnvironmentReturn(
            [{"role": "environment", "content": ""}] * size,
            list(metadata),
            [None] * size,
            torch.tensor(rewards),
            torch.ones(size, dtype=torch.bool),
            None,
        )

    def global_post_process_and_metrics(self, batch):
        return batch, {}


register_env("last_token_parity", f"{__name__}.LastTokenParityEnvironment")
OVERRIDES = [
    f"grpo.max_num_steps={ITERATIONS}",
    "grpo.use_dynamic_sampling=true",
    "grpo.dynamic_sampling_max_gen_batches=8",
    "data.default.env_name=last_token_parity",
    "+env.last_token_parity={}",
]


def run(config: Path, root: Path, run_id: str) -> dict:
    return grpo(config_path=str(config), overrides=OVERRIDES, run_id=run_id, storage_root=str(root))


def stages(root: Path, run_id: str, iteration: int) -> dict:
    path = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


@pytest.fixture(scope="module")
def clean(tiny_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("storage")
    run(tiny_config, root, "clean")
    return root


def test_refill_rounds_fill_the_step_batch(clean):
    refills = 0
    for iteration in range(ITERATIONS):
        recorded = stages(clean, "clean", iteration)
        rounds = sorted(name for name in recorded if name.startswith("reward"))
        refills += len(rounds) - 1
        last = recorded[rounds[-1]]
        assert last["metrics"]["dynamic_sampling_kept_total"] == 16  # 4 prompts x 4 samples
        assert last["metrics"]["dynamic_sampling_num_gen_batches"] == len(rounds)
        for name in rounds[1:]:  # each round generated from its own prompts
            suffix = name.partition(".")[2]
            assert {f"prompts.{suffix}", f"generate.{suffix}"} <= set(recorded)
        assert recorded["logprob"]["status"] == "complete"
    assert refills > 0, "no refill round happened: the test would not test refills"


def test_fault_in_a_refill_round_resumes_bit_identically(clean, tiny_config, tmp_path, monkeypatch):
    refilled = next(
        (i, name)
        for i in range(ITERATIONS)
        for name in stages(clean, "clean", i)
        if name.startswith("generate.")
    )
    monkeypatch.setenv(FAULT_ENV, f"{refilled[1]}@{refilled[0]}")
    with pytest.raises(Exception, match="fault injected"):
        run(tiny_config, tmp_path, "faulty")
    monkeypatch.delenv(FAULT_ENV)
    run(tiny_config, tmp_path, "faulty")
    step = f"step_{ITERATIONS:06d}"
    expected = load_file(clean / "runs" / "clean" / "checkpoints" / step / "model.safetensors")
    got = load_file(tmp_path / "runs" / "faulty" / "checkpoints" / step / "model.safetensors")
    assert all(expected[name].equal(got[name]) for name in expected)


def test_rerun_of_the_first_round_marks_later_rounds_stale(clean):
    iteration = next(i for i in range(ITERATIONS) if "reward.1" in stages(clean, "clean", i))
    before = stages(clean, "clean", iteration)
    rerun_stage(run_id="clean", iteration=iteration, stage="reward", storage_root=str(clean))
    after = stages(clean, "clean", iteration)
    assert after["reward"]["outputs"] == before["reward"]["outputs"]  # bit-identical
    assert after["reward.1"]["status"] == "stale" and after["logprob"]["status"] == "stale"
    assert after["generate"]["status"] == "complete"
