"""Generation and logprob split into shards (``orchestration.fan_out``) on the real model:
each sample is sampled with its own seed and each shard computes whole engine batches, so
the joined shards are the stage computed whole, bit for bit. (The fan-out rules themselves,
for any stage, are tests/orchestration/test_fan_out.py's, on the toy pipeline.)"""

from pathlib import Path

import pytest
from flow_testing import assert_bit_identical, checkpoint_dir, stages_of

from flows.grpo import grpo
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples/configs/grpo_math_tiny_fast.yaml"
# shards hold whole engine batches (HF generates policy.generation_batch_size prompts per
# call) and whole logprob microbatches
CHUNKED = ["policy.generation_batch_size=2", "policy.logprob_batch_size=2"]
ROLLOUT_SPLIT = [
    *CHUNKED,
    "++orchestration.fan_out.generate=2",
    "++orchestration.fan_out.logprob=2",
]


def run(root: Path, run_id: str, overrides: list[str]) -> dict:
    return grpo(config_path=str(CONFIG), overrides=overrides, run_id=run_id, storage_root=str(root))


def test_split_generate_and_logprob_are_the_unsplit_stages_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard that failed is computed alone when the run continues."""
    run(tmp_path, "whole", CHUNKED)
    monkeypatch.setenv(FAULT_ENV, "generate/shard-1-of-2@1")
    with pytest.raises(Exception, match="fault injected"):
        run(tmp_path, "split", ROLLOUT_SPLIT)
    folder = tmp_path / "runs" / "split" / "iter_000001" / "generate"
    before = {p.name: p.read_text() for p in folder.glob("*.entry.json")}
    assert sorted(before) == ["shard-0-of-2.entry.json"]
    monkeypatch.delenv(FAULT_ENV)
    run(tmp_path, "split", ROLLOUT_SPLIT)
    assert (folder / "shard-0-of-2.entry.json").read_text() == before["shard-0-of-2.entry.json"]
    for iteration in (0, 1):
        whole, split = (stages_of(tmp_path, run_id, iteration) for run_id in ("whole", "split"))
        for stage in ("generate", "logprob"):
            assert split[stage]["outputs"] == whole[stage]["outputs"], (iteration, stage)
        assert (
            split["generate"]["metrics"]["mean_gen_tokens_per_sample"]
            == whole["generate"]["metrics"]["mean_gen_tokens_per_sample"]
        )
    assert_bit_identical(checkpoint_dir(tmp_path, "whole", 2), checkpoint_dir(tmp_path, "split", 2))
