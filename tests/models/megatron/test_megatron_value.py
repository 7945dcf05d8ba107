"""MegatronValue against HFValue: same values, same train step, interchangeable checkpoints."""

import pytest
import torch
from conftest import make_batch, policy_config
from safetensors.torch import load_file

from nemo_rl_core.algorithms.loss import MseValueLossFn
from nemo_rl_core.models.value import make_value_model
from nemo_rl_core.models.value.config import ValueConfig
from nemo_rl_core.models.value.hf_value import HFValue
from nemo_rl_core.models.value.megatron_value import MegatronValue

pytestmark = pytest.mark.megatron


def test_value_train_step_and_checkpoint_match_hf(tiny_model_dir, vocab_size, tmp_path) -> None:
    data = make_batch(vocab_size, seed=4)
    loss_fn = MseValueLossFn({"cliprange": None})
    megatron = make_value_model(policy_config(tiny_model_dir, "megatron", ValueConfig))
    assert isinstance(megatron, MegatronValue)
    hf = HFValue(policy_config(tiny_model_dir, "hf", ValueConfig))
    try:
        assert torch.count_nonzero(megatron.get_values(data)["values"]) == 0, "head starts at 0"
        for _ in range(2):
            got, want = megatron.train(data, loss_fn), hf.train(data, loss_fn)
            torch.testing.assert_close(got["loss"], want["loss"], atol=1e-5, rtol=1e-5)
        values = megatron.get_values(data)["values"]
        assert torch.count_nonzero(values[:, 1:]) > 0 and torch.all(values[:, 0] == 0)
        torch.testing.assert_close(values, hf.get_values(data)["values"], atol=1e-4, rtol=0)
        megatron.save_checkpoint(tmp_path / "megatron", optimizer_path=tmp_path / "optim")
        hf.save_checkpoint(tmp_path / "hf")
    finally:
        megatron.shutdown()
    got_w = load_file(tmp_path / "megatron" / "model.safetensors")
    want_w = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(got_w) == set(want_w)
    for key in want_w:
        torch.testing.assert_close(got_w[key], want_w[key], atol=1e-4, rtol=0, msg=key)
    reloaded = HFValue(policy_config(tmp_path / "megatron", "hf", ValueConfig))
    torch.testing.assert_close(reloaded.get_values(data)["values"], values, atol=1e-5, rtol=0)
