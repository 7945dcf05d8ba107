"""One training step of the HF backend over four gloo ranks (torchrun --standalone): FSDP2
over all four, HSDP (``dtensor_cfg.dp_replicate_size: 2``: two replicas of a two-rank shard
group), and HSDP beside tensor parallelism (2 replicas x 1 shard x TP 2) each take the
one-process step: the same loss and grad norm, and the same weights after it."""

from pathlib import Path
from typing import Any

import pytest
import torch
from policy_testing import policy_config, run_on_ranks, token_batch

from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.models.policy import make_policy

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]
MESHES = {  # name -> dtensor_cfg on four ranks, and the device mesh it makes
    "fsdp4": ({"tensor_parallel_size": 1, "dp_replicate_size": 1}, {"dp": 4, "tp": 1}),
    "hsdp2x2": (
        {"tensor_parallel_size": 1, "dp_replicate_size": 2},
        {"dp_replicate": 2, "dp_shard": 2, "tp": 1},
    ),
    "hsdp2x1-tp2": (
        {"tensor_parallel_size": 2, "dp_replicate_size": 2},
        {"dp_replicate": 2, "dp_shard": 1, "tp": 2},
    ),
}


def compute(model_dir: Path) -> dict[str, dict[str, Any]]:
    """Loss, grad norm and the logprobs after one step, for every mesh across ranks (in one
    process: once, unsharded)."""
    data = token_batch(batch=8)
    across = torch.distributed.is_initialized()
    results: dict[str, dict[str, Any]] = {}
    for mesh, (dtensor, _) in MESHES.items() if across else [("one", ({}, {}))]:
        config = policy_config(model_dir, train_global_batch_size=8, dtensor_cfg=dtensor)
        policy = make_policy(config, init_reference_model=False)
        try:
            before = policy.get_logprobs(data)["logprobs"]
            step = policy.train(data, NLLLossFn())
            sharding = getattr(policy, "sharding", None)
            results[mesh] = {
                "mesh": {}
                if sharding is None
                else dict(zip(sharding.mesh.mesh_dim_names, sharding.mesh.shape, strict=True)),
                "logprobs_before": before,
                "loss": float(step["loss"].sum()),
                "grad_norm": float(step["grad_norm"]),
                "logprobs_after": policy.get_logprobs(data)["logprobs"],
            }
        finally:
            policy.shutdown()
    return results


def test_fsdp_and_hsdp_over_four_ranks_take_the_one_process_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    ranks = run_on_ranks(4, __file__, tiny_model_dir, tmp_path)
    [expected] = compute(tiny_model_dir).values()
    moved = (expected["logprobs_after"] - expected["logprobs_before"]).abs().max()
    assert moved > 1e-3, "the step changed the weights"
    for mesh, (_, dims) in MESHES.items():
        for rank, results in enumerate(ranks):
            got, label = results[mesh], f"rank {rank} of {mesh}"
            assert got["mesh"] == dims, label
            assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5), label
            assert got["grad_norm"] == pytest.approx(expected["grad_norm"], abs=1e-5), label
            torch.testing.assert_close(
                got["logprobs_after"], expected["logprobs_after"], atol=1e-5, rtol=0, msg=label
            )
