"""Megatron's ranks leave device memory between steps (NeMo RL's colocated lifecycle) and
come back with every value they had: training goes on exactly as if they had never left."""

from typing import Any

import pytest
import torch
from conftest import LR, make_batch, policy_config

from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.models.megatron import offload
from nemo_rl_core.models.megatron.offload import distinct_storages
from nemo_rl_core.models.megatron.worker import MegatronWorker
from nemo_rl_core.models.policy.megatron_policy import MegatronPolicy
from nemo_rl_core.models.policy.offload import Offloadable

pytestmark = pytest.mark.megatron


@pytest.fixture(autouse=True)
def host_memory_as_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Park host storages too: on this machine they stand in for GPU memory."""
    monkeypatch.setattr(offload, "in_device_memory", lambda storage: True)


LAYOUTS = {
    "fp32": {},
    "bf16": {"precision": "bfloat16"},  # Float16Module, fp32 main copies in the optimizer
    "fp32-ddp-optimizer": {"use_distributed_optimizer": False},
}


def make(tiny_model_dir: Any, layout: str, **update: Any) -> MegatronPolicy:
    settings = dict(LAYOUTS[layout])
    precision = settings.pop("precision", "float32")
    optimizer = {"lr": LR, "min_lr": LR, "weight_decay": 0.0, "clip_grad": 1.0, **settings}
    config = policy_config(tiny_model_dir, "megatron", optimizer=optimizer)
    return MegatronPolicy(config.model_copy(update={"precision": precision, **update}))


def worker_of(policy: MegatronPolicy) -> MegatronWorker:
    worker = policy.workers.worker  # type: ignore[attr-defined]  # world size 1: in process
    assert isinstance(worker, MegatronWorker)
    return worker


def bytes_held(tensors: list[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def optimizer_bytes(worker: MegatronWorker) -> int:
    """Bytes of the optimizer's own storages (in fp32 its parameters are the weights)."""
    weights = distinct_storages(worker._weight_tensors())
    own = distinct_storages(worker._optimizer_tensors(), besides=weights)
    return sum(storage.nbytes() for storage in own)


def step(policy: MegatronPolicy, seed: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    result = policy.train(make_batch(vocab_size, seed=seed), NLLLossFn())
    return result["loss"], result["grad_norm"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_offloaded_ranks_hold_nothing_and_train_on_as_if_they_never_left(
    tiny_model_dir, vocab_size, layout
) -> None:
    plain = make(tiny_model_dir, layout)
    try:
        want = [step(plain, seed, vocab_size) for seed in (4, 5, 6)]
        want_weights = plain.state_dict_for_refit()
        want_reference = plain.get_reference_policy_logprobs(make_batch(vocab_size, seed=7))
    finally:
        plain.shutdown()

    policy = make(tiny_model_dir, layout)
    try:
        assert isinstance(policy, Offloadable)
        worker = worker_of(policy)
        policy.offload(weights=True)  # before any step: no optimizer state yet
        got = [step(policy, 4, vocab_size)]
        for seed in (5, 6):
            policy.offload(weights=True)
            policy.offload(weights=True)  # a second offload changes nothing
            weights = worker._weight_tensors()
            assert bytes_held(weights) == 0, "parameters and reference weights left"
            assert bytes_held(worker._grad_buffers()) == 0
            assert optimizer_bytes(worker) == 0
            got.append(step(policy, seed, vocab_size))
        for (loss, norm), (want_loss, want_norm) in zip(got, want, strict=True):
            assert torch.equal(loss, want_loss) and torch.equal(norm, want_norm)
        policy.offload(weights=True)
        got_weights = policy.state_dict_for_refit()
        assert got_weights.keys() == want_weights.keys()
        assert all(torch.equal(got_weights[k], want_weights[k]) for k in want_weights)
        policy.offload(weights=True)
        got_reference = policy.get_reference_policy_logprobs(make_batch(vocab_size, seed=7))
        assert torch.equal(
            got_reference["reference_logprobs"], want_reference["reference_logprobs"]
        )
    finally:
        policy.shutdown()


def test_the_colocated_lifecycle_moves_what_each_phase_does_not_need(
    tiny_model_dir, vocab_size
) -> None:
    """Before the refit the optimizer state and gradients leave (the weights are being
    sent), after it the weights too; logprobs bring the weights back and, with
    ``offload_optimizer_for_logprob``, keep the optimizer state out; training brings all."""
    policy = make(tiny_model_dir, "fp32", offload_optimizer_for_logprob=True)
    try:
        worker = worker_of(policy)
        step(policy, 4, vocab_size)
        weights, grads = worker._weight_tensors(), worker._grad_buffers()
        held = {"weights": bytes_held(weights), "optimizer": optimizer_bytes(worker)}
        assert held["weights"] > 0 and held["optimizer"] > 0 and bytes_held(grads) > 0

        policy.offload_before_refit()
        assert bytes_held(weights) == held["weights"]
        assert bytes_held(grads) == 0 and optimizer_bytes(worker) == 0
        assert policy.state_dict_for_refit(), "the weights are there to send"
        policy.offload_after_refit()
        assert bytes_held(weights) == 0

        policy.prepare_for_lp_inference()
        assert bytes_held(weights) == held["weights"]
        assert bytes_held(grads) == 0 and optimizer_bytes(worker) == 0
        policy.get_logprobs(make_batch(vocab_size, seed=5))
        assert optimizer_bytes(worker) == 0, "logprobs leave the optimizer out"

        policy.prepare_for_training()
        assert bytes_held(grads) > 0
        assert optimizer_bytes(worker) == held["optimizer"]
    finally:
        policy.shutdown()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the weights are in GPU memory")
def test_without_cuda_nothing_is_parked(tiny_model_dir, vocab_size, monkeypatch) -> None:
    """Host memory is where everything already is: an offload copies nothing."""
    monkeypatch.undo()
    policy = make(tiny_model_dir, "fp32")
    try:
        step(policy, 4, vocab_size)
        worker = worker_of(policy)
        held = bytes_held(worker._weight_tensors()) + bytes_held(worker._grad_buffers())
        policy.offload(weights=True)
        assert bytes_held(worker._weight_tensors()) + bytes_held(worker._grad_buffers()) == held
        assert not worker._parked_weights.is_parked and not worker._parked_grads.is_parked
    finally:
        policy.shutdown()
