"""The CPU compatibility layer is pinned: it fails loudly if megatron-core moves under it."""

import pytest
import torch

from nemo_rl_core.models.megatron import cpu_compat
from nemo_rl_core.models.megatron.cpu_compat import (
    MEGATRON_CORE_VERSION,
    PATCH_POINTS,
    MegatronCoreVersionError,
    apply_cpu_compat,
    cuda_as_cpu,
    megatron_core_version,
    verify_patch_points,
)

pytestmark = pytest.mark.megatron


def test_installed_megatron_core_is_the_pinned_version() -> None:
    assert megatron_core_version() == MEGATRON_CORE_VERSION == "0.16.1"


def test_every_patch_point_still_exists_with_its_signature() -> None:
    verify_patch_points()
    assert len(PATCH_POINTS) >= 10


def test_another_version_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(cpu_compat, "megatron_core_version", lambda: "0.17.0")
    with pytest.raises(MegatronCoreVersionError, match=r"0\.16\.1.*found 0\.17\.0"):
        verify_patch_points()


def test_a_moved_patch_point_is_named(monkeypatch) -> None:
    points = (*PATCH_POINTS, ("megatron.core.transformer.utils", "no_such_helper", (), None))
    monkeypatch.setattr(cpu_compat, "PATCH_POINTS", points)
    with pytest.raises(MegatronCoreVersionError, match="no_such_helper"):
        verify_patch_points()
    changed = (
        ("megatron.core.transformer.utils", "get_default_causal_mask", ("sq", "gone"), None),
    )
    monkeypatch.setattr(cpu_compat, "PATCH_POINTS", changed)
    with pytest.raises(MegatronCoreVersionError, match="gone"):
        verify_patch_points()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the layer is a no-op with CUDA")
def test_patches_redirect_cuda_to_cpu() -> None:
    import megatron.core.pipeline_parallel.schedules as schedules
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.transformer.utils as transformer_utils

    assert apply_cpu_compat() is True
    assert apply_cpu_compat() is True  # idempotent
    mask = transformer_utils.get_default_causal_mask(4)
    assert mask.device.type == "cpu" and mask.dtype == torch.bool
    assert torch.equal(mask, torch.ones(4, 4, dtype=torch.bool).triu(1))
    state = mrandom._get_cuda_rng_state()
    first = torch.rand(3)
    mrandom._set_cuda_rng_state(state)
    assert torch.equal(torch.rand(3), first), "RNG state must round-trip through the CPU generator"
    assert schedules.torch.zeros([], device="cuda").device.type == "cpu"
    with cuda_as_cpu():
        t = torch.zeros(2, device="cuda")
        assert t.device.type == "cpu" and t.type() == "torch.cuda.FloatTensor"
        assert t.cuda() is t
    assert torch.zeros(1).type() == "torch.FloatTensor", "the mode must not leak"
