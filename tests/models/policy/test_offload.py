"""Offloading a policy between steps (NeMo RL's colocated lifecycle). The moves themselves
are checked here onto the ``meta`` device, the one device besides the host every machine
has; tests/gpu checks the GPU memory they free and that training continues the same."""

from pathlib import Path

import torch
from policy_testing import policy_config, token_batch

from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.policy.offload import move_module, move_optimizer_state

META = torch.device("meta")


def test_the_optimizer_state_moves_but_its_step_count_stays_on_the_host() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight])
    weight.sum().backward()
    optimizer.step()
    move_optimizer_state(optimizer, META)
    state = optimizer.state[weight]
    assert state["exp_avg"].device == META and state["exp_avg_sq"].device == META
    assert state["step"].device == torch.device("cpu")


def test_a_module_moves_with_its_buffers() -> None:
    module = torch.nn.BatchNorm1d(4)
    move_module(module, META)
    assert {t.device for t in [*module.parameters(), *module.buffers()]} == {META}


def test_a_policy_offloaded_between_steps_computes_as_one_never_offloaded(
    tiny_model_dir: Path,
) -> None:
    """Each pass after an offload runs without a prepare call, as after one; on a machine
    without CUDA every move is a no-op, so the numbers must be the very same."""
    config = policy_config(tiny_model_dir, offload_optimizer_for_logprob=True)
    kept, offloaded = make_policy(config), make_policy(config)
    data = token_batch()
    for _ in range(2):
        offloaded.offload_before_refit()
        offloaded.state_dict_for_refit()
        offloaded.offload_after_refit()
        torch.testing.assert_close(
            offloaded.get_logprobs(data)["logprobs"], kept.get_logprobs(data)["logprobs"]
        )
        offloaded.prepare_for_lp_inference()
        offloaded.get_reference_policy_logprobs(data)
        assert offloaded.train(data, NLLLossFn())["loss"] == kept.train(data, NLLLossFn())["loss"]
