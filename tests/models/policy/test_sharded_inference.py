"""Inference on a model sharded over two gloo ranks (torchrun --standalone): with two
data-parallel ranks each computes its share of the batch (an odd batch is padded to an even
one) and every rank gets all the results; with tensor parallelism (and sequence parallelism)
both compute it all. Either way the logprobs and top-k logits equal one process's, for each
microbatch layout."""

from pathlib import Path

import pytest
import torch
from policy_testing import policy_config, run_on_ranks, token_batch
from test_hf_policy import LAYOUTS

from nemo_rl_core.models.policy import make_policy

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]
MESHES = {  # name -> dtensor_cfg on two ranks
    "dp2": {"tensor_parallel_size": 1},
    "tp2": {"tensor_parallel_size": 2},
    "tp2-sp": {"tensor_parallel_size": 2, "sequence_parallel": True},
}
TOPK = 4


def compute(model_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Logprobs and top-k logits of an odd batch for every layout (and, across ranks, every
    mesh); in one process, the layouts only."""
    data = token_batch(batch=5)
    across = torch.distributed.is_initialized()
    results: dict[str, dict[str, torch.Tensor]] = {}
    for mesh, dtensor in MESHES.items() if across else [("one", {})]:
        for layout, settings in LAYOUTS.items():
            config = policy_config(model_dir, **settings, dtensor_cfg=dtensor)
            policy = make_policy(config, init_optimizer=False, init_reference_model=False)
            rows: list[int] = []  # the samples this rank's model computed, per microbatch
            policy.model.register_forward_pre_hook(
                lambda _, args, kwargs, seen=rows: seen.append(kwargs["input_ids"].shape[0]),
                with_kwargs=True,
            )
            try:
                topk = policy.get_topk_logits(data, k=TOPK)
                results[f"{mesh}-{layout}"] = {
                    "logprobs": policy.get_logprobs(data)["logprobs"],
                    "topk_logits": topk["topk_logits"],
                    "topk_indices": topk["topk_indices"],
                    "rows": torch.tensor(sum(rows)),
                }
            finally:
                policy.shutdown()
    return results


def test_inference_over_two_ranks_equals_one_process(tiny_model_dir: Path, tmp_path: Path):
    ranks = run_on_ranks(2, __file__, tiny_model_dir, tmp_path)
    single = compute(tiny_model_dir)
    # two passes (top-k, logprobs) over 5 samples: each data-parallel rank computed 3 of
    # the 6 the batch was padded to; each tensor-parallel rank all 5
    for rank in ranks:
        assert rank["dp2-padded"]["rows"] == 2 * 3
        assert rank["tp2-padded"]["rows"] == rank["tp2-sp-padded"]["rows"] == 2 * 5
    for layout in LAYOUTS:
        expected = single[f"one-{layout}"]
        for mesh in MESHES:
            for rank, results in enumerate(ranks):
                got = results[f"{mesh}-{layout}"]
                for name, value in expected.items():
                    if name == "rows":
                        continue
                    label = f"{name} of {layout} on rank {rank} of {mesh}"
                    assert got[name].shape == value.shape, label
                    if name == "topk_indices":
                        assert torch.equal(got[name], value), label
                    else:
                        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=0, msg=label)
