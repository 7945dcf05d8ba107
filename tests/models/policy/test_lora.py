"""LoRA from ``policy.dtensor_cfg.lora_cfg``: only adapters train, the base stays bit-identical,
generation gets merged weights, and checkpoints load in transformers and peft."""

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from policy_testing import manual_logprobs, policy_config, token_batch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.algorithms.ppo import PPOMasterConfig
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.policy.lora import ADAPTER_DIR
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import Machine, UnsupportedConfigError, check_support

LORA = {"enabled": True, "dim": 4, "alpha": 8}
CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
CONFIG, PPO_CONFIG = str(CONFIGS / "grpo_math_tiny.yaml"), str(CONFIGS / "ppo_tiny.yaml")


def lora_config(model_dir: Path, **lora):
    return policy_config(model_dir, dtensor_cfg={"lora_cfg": {**LORA, **lora}})


def base_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


def test_fresh_adapters_leave_the_model_unchanged(tiny_model_dir: Path, batch) -> None:
    policy = make_policy(lora_config(tiny_model_dir), init_optimizer=False)
    got = policy.get_logprobs(batch)["logprobs"]
    torch.testing.assert_close(got, manual_logprobs(tiny_model_dir, batch), atol=1e-5, rtol=0)


def test_only_adapters_train_and_the_base_stays_bit_identical(tiny_model_dir: Path) -> None:
    policy = make_policy(lora_config(tiny_model_dir))
    optimized = {id(p) for group in policy.optimizer.param_groups for p in group["params"]}
    names = {name for name, p in policy.model.named_parameters() if id(p) in optimized}
    assert names and all("lora_" in name for name in names)
    lora_linears = {name.split(".lora_")[0] for name in names}
    assert any("q_proj" in n for n in lora_linears) and any("down_proj" in n for n in lora_linears)
    before = policy.get_logprobs(token_batch())["logprobs"]
    for _ in range(3):
        policy.train(token_batch(), NLLLossFn())
    assert not torch.allclose(policy.get_logprobs(token_batch())["logprobs"], before)
    base = base_weights(tiny_model_dir)
    for name, value in policy.model.get_base_model().state_dict().items():
        if "lora_" not in name:
            key = name.replace(".base_layer", "")
            tied = key == "lm_head.weight" and key not in base  # tied to the embedding
            assert torch.equal(value, base["model.embed_tokens.weight" if tied else key]), name


def test_generation_and_checkpoints_see_merged_weights(tiny_model_dir: Path, tmp_path: Path):
    policy = make_policy(lora_config(tiny_model_dir))
    policy.train(token_batch(), NLLLossFn())
    data = token_batch(seed=3)
    trained = policy.get_logprobs(data)["logprobs"]
    policy.save_checkpoint(tmp_path / "ckpt", optimizer_path=tmp_path / "ckpt" / "optimizer")

    merged = policy.state_dict_for_refit()  # what a generation engine is handed
    assert not any("lora_" in name for name in merged)
    assert set(merged) - {"lm_head.weight"} == set(base_weights(tiny_model_dir))
    on_disk = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert all(torch.equal(on_disk[k], merged[k]) for k in on_disk)

    # transformers loads the merged checkpoint as a plain model
    torch.testing.assert_close(manual_logprobs(tmp_path / "ckpt", data), trained, atol=1e-5, rtol=0)
    # peft loads the adapters over the base model
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "ckpt" / ADAPTER_DIR))
    with torch.no_grad():
        logits = adapted(input_ids=data["input_ids"][:1, :8]).logits
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    with torch.no_grad():
        expected = reference(input_ids=data["input_ids"][:1, :8]).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)

    # the next stage continues from base + saved adapters, bit-exactly
    resumed = make_policy(
        lora_config(tiny_model_dir),
        weights_path=tmp_path / "ckpt",
        optimizer_path=tmp_path / "ckpt" / "optimizer",
    )
    assert torch.equal(resumed.get_logprobs(data)["logprobs"], trained)
    policy.train(token_batch(seed=5), NLLLossFn())
    resumed.train(token_batch(seed=5), NLLLossFn())
    for (name, a), (_, b) in zip(
        policy.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_adapters_train_the_same_under_activation_checkpointing(tiny_model_dir: Path):
    """Non-reentrant recomputation: the frozen base's inputs need no grad, yet adapters get it."""
    trained = []
    for on in (False, True):
        config = lora_config(tiny_model_dir).model_copy(deep=True)
        config.dtensor_cfg.activation_checkpointing = on
        policy = make_policy(config, init_reference_model=False)
        policy.train(token_batch(), NLLLossFn())
        trained.append({n: p.detach().clone() for n, p in policy.model.named_parameters()})
    plain, checkpointed = trained
    assert any("lora_B" in name and value.abs().sum() > 0 for name, value in checkpointed.items())
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (["policy.dtensor_cfg.lora_cfg.dropout=0.1"], "lora_cfg.dropout_position='post'"),
        # With Megatron on, NeMo RL reads no dtensor_cfg key but enabled, which must be off.
        (["policy.megatron_cfg.enabled=true"], "dtensor_cfg.enabled=True: Megatron-core trains"),
    ],
)
def test_lora_keys_that_cannot_work_are_refused(overrides: list[str], refused: str) -> None:
    config = load_master_config(CONFIG, ["policy.dtensor_cfg.lora_cfg.enabled=true", *overrides])
    with pytest.raises(UnsupportedConfigError, match=refused):
        check_support(config, Machine(cuda_devices=0), source="lora")


def test_lora_on_the_value_model_is_refused() -> None:
    with pytest.raises(
        ConfigError, match="value: .*dtensor_cfg.lora_cfg.enabled: .*not the value model"
    ):
        load_master_config(PPO_CONFIG, ["value.dtensor_cfg.lora_cfg.enabled=true"], PPOMasterConfig)
