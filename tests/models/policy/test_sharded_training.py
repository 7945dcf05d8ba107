"""One training step of the HF backend over four gloo ranks (torchrun --standalone): FSDP2
over all four, HSDP (``dtensor_cfg.dp_replicate_size: 2``: two replicas of a two-rank shard
group), HSDP beside tensor parallelism (2 replicas x 1 shard x TP 2), and tensor parallelism
with sequence parallelism (dp 2 x TP 2, the activations between the TP regions split along
the sequence; also with activations recomputed in backward) each take the one-process
step: the same loss and grad norm, and the same weights after it, for the policy and for a
value model (whose score head gathers the sequence before it runs whole)."""

from pathlib import Path
from typing import Any

import pytest
import torch
from policy_testing import policy_config, run_on_ranks, token_batch

from nemo_rl_core.algorithms.loss import MseValueLossFn, NLLLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.value import ValueConfig, make_value_model

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
    "tp2-sp": ({"tensor_parallel_size": 2, "sequence_parallel": True}, {"dp": 2, "tp": 2}),
    "tp2-sp-recompute": (  # activations recomputed in backward, as NeMo RL's SP recipes do
        {"tensor_parallel_size": 2, "sequence_parallel": True, "activation_checkpointing": True},
        {"dp": 2, "tp": 2},
    ),
}
VALUE_MESHES = ("fsdp4", "tp2-sp")


def mesh_of(model: Any) -> dict[str, int]:
    sharding = getattr(model, "sharding", None)
    if sharding is None:
        return {}
    return dict(zip(sharding.mesh.mesh_dim_names, sharding.mesh.shape, strict=True))


def policy_step(model_dir: Path, dtensor: dict[str, Any], data: BatchedDataDict) -> dict:
    config = policy_config(model_dir, train_global_batch_size=8, dtensor_cfg=dtensor)
    policy = make_policy(config, init_reference_model=False)
    try:
        before = policy.get_logprobs(data)["logprobs"]
        step = policy.train(data, NLLLossFn())
        return {
            "mesh": mesh_of(policy),
            "before": before,
            "loss": float(step["loss"].sum()),
            "grad_norm": float(step["grad_norm"]),
            "after": policy.get_logprobs(data)["logprobs"],
        }
    finally:
        policy.shutdown()


def value_step(model_dir: Path, dtensor: dict[str, Any], data: BatchedDataDict) -> dict:
    policy = policy_config(model_dir, train_global_batch_size=8).model_dump()
    keys = ("model_name", "train_global_batch_size", "train_micro_batch_size", "precision")
    settings = {key: policy[key] for key in keys}
    config = ValueConfig.model_validate(
        {
            **settings,
            "max_total_sequence_length": 32,
            "dtensor_cfg": dtensor,
            "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 3e-3, "weight_decay": 0.0}},
        }
    )
    value = make_value_model(config)
    try:
        step = value.train(data, MseValueLossFn({}))
        return {
            "mesh": mesh_of(value),
            "before": torch.zeros_like(data["returns"]),  # a fresh score head predicts 0
            "loss": float(step["loss"].sum()),
            "grad_norm": float(step["grad_norm"]),
            "after": value.get_values(data)["values"],
        }
    finally:
        value.shutdown()


def compute(model_dir: Path) -> dict[str, dict[str, Any]]:
    """One step of the policy and of a value model for every mesh across ranks (in one
    process: once each, unsharded)."""
    data = token_batch(batch=8)
    data["returns"] = torch.tensor([1.0, -1.0] * 4).unsqueeze(1) * data["token_mask"]
    across = torch.distributed.is_initialized()
    results: dict[str, dict[str, Any]] = {}
    for mesh, (dtensor, _) in MESHES.items() if across else [("one", ({}, {}))]:
        results[f"policy-{mesh}"] = policy_step(model_dir, dtensor, data)
        if mesh in VALUE_MESHES or not across:
            results[f"value-{mesh}"] = value_step(model_dir, dtensor, data)
    return results


def test_fsdp_hsdp_and_sequence_parallelism_over_four_ranks_take_the_one_process_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    ranks = run_on_ranks(4, __file__, tiny_model_dir, tmp_path)
    single = compute(tiny_model_dir)
    for model in ("policy", "value"):
        expected = single[f"{model}-one"]
        moved = (expected["after"] - expected["before"]).abs().max()
        assert moved > 1e-3, f"the {model}'s step changed its weights"
        for mesh, (_, dims) in MESHES.items():
            if model == "value" and mesh not in VALUE_MESHES:
                continue
            for rank, results in enumerate(ranks):
                got, label = results[f"{model}-{mesh}"], f"{model} on rank {rank} of {mesh}"
                assert got["mesh"] == dims, label
                assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5), label
                assert got["grad_norm"] == pytest.approx(expected["grad_norm"], abs=1e-5), label
                torch.testing.assert_close(
                    got["after"], expected["after"], atol=1e-5, rtol=0, msg=label
                )
