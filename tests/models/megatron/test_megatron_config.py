"""policy.megatron_cfg validates NeMo RL's keys and names what is wrong."""

import os
from pathlib import Path

import pytest
from policy_testing import NO_GPU, ONE_GPU, support_refusals
from pydantic import ValidationError

from nemo_rl_core.models.megatron.config import MegatronConfig
from nemo_rl_core.utils.key_support import Machine

NEMO_RL_YAML = {  # policy.megatron_cfg of NeMo RL's grpo_math_1B_megatron.yaml, interpolations filled
    "enabled": True,
    "empty_unused_memory_level": 0,
    "activation_checkpointing": False,
    "converter_type": "Qwen2ForCausalLM",
    "tensor_model_parallel_size": 1,
    "expert_tensor_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "num_layers_in_first_pipeline_stage": None,
    "num_layers_in_last_pipeline_stage": None,
    "context_parallel_size": 1,
    "pipeline_dtype": "bfloat16",
    "sequence_parallel": False,
    "freeze_moe_router": True,
    "moe_router_dtype": "fp64",
    "moe_router_load_balancing_type": "none",
    "moe_router_bias_update_rate": 0.0,
    "moe_permute_fusion": False,
    "apply_rope_fusion": True,
    "bias_activation_fusion": True,
    "defer_fp32_logits": False,
    "optimizer": {
        "optimizer": "adam",
        "lr": 5.0e-6,
        "min_lr": 5.0e-7,
        "weight_decay": 0.01,
        "bf16": True,
        "fp16": False,
        "params_dtype": "float32",
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_eps": 1e-8,
        "sgd_momentum": 0.9,
        "use_distributed_optimizer": True,
        "use_precision_aware_optimizer": True,
        "clip_grad": 1.0,
        "optimizer_cpu_offload": False,
        "optimizer_offload_fraction": 0.0,
    },
    "scheduler": {
        "start_weight_decay": 0.01,
        "end_weight_decay": 0.01,
        "weight_decay_incr_style": "constant",
        "lr_decay_style": "constant",
        "lr_decay_iters": 1000,
        "lr_warmup_iters": 13,
        "lr_warmup_init": 5.0e-7,
    },
    "distributed_data_parallel_config": {
        "grad_reduce_in_fp32": False,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "average_in_collective": True,
        "use_custom_fsdp": False,
        "data_parallel_sharding_strategy": "optim_grads_params",
    },
    "fp8_cfg": None,
    "env_vars": None,
}


def _restricted(dumped: dict, like: dict) -> dict:
    return {
        k: _restricted(dumped[k], v) if isinstance(v, dict) else dumped[k] for k, v in like.items()
    }


def test_nemo_rl_yaml_validates_unchanged() -> None:
    cfg = MegatronConfig(**NEMO_RL_YAML)
    assert _restricted(cfg.model_dump(), NEMO_RL_YAML) == NEMO_RL_YAML


def test_defaults_and_weight_decay_fallback() -> None:
    cfg = MegatronConfig(optimizer={"weight_decay": 0.1}, scheduler={"end_weight_decay": 0.2})
    assert cfg.weight_decay_range == (0.1, 0.2)
    assert cfg.tensor_model_parallel_size == cfg.data_parallel_size == 1
    assert cfg.optimizer.optimizer == "adam" and cfg.optimizer.use_distributed_optimizer


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"optimizer": {"lrr": 1.0}}, "optimizer.lrr"),
        ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size"),
        ({"scheduler": {"lr_decay_style": "exp"}}, "scheduler.lr_decay_style"),
    ],
)
def test_invalid_keys_are_named(override, message) -> None:
    with pytest.raises(ValidationError, match=message):
        MegatronConfig(**override)


MEGATRON = ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]


@pytest.mark.parametrize(
    ("overrides", "machine", "refused"),
    [
        (
            ["policy.megatron_cfg.optimizer.bf16=true"],
            NO_GPU,
            "policy.megatron_cfg.optimizer.bf16=True: must agree with precision='float32'",
        ),
        (
            [
                "policy.megatron_cfg.scheduler.lr_decay_style=cosine",
                "policy.megatron_cfg.scheduler.lr_decay_iters=null",
            ],
            NO_GPU,
            "lr_decay_iters=None: null decays over NeMo RL's train_iters",
        ),
        (
            ["policy.megatron_cfg.tensor_model_parallel_size=2"],
            ONE_GPU,
            "tensor_model_parallel_size=2: tensor x data parallel = 2 ranks need 2 GPUs",
        ),
        (
            ["policy.megatron_cfg.distributed_data_parallel_config.use_custom_fsdp=true"],
            NO_GPU,
            "use_custom_fsdp=True: Megatron's own FSDP is not built",
        ),
        (["policy.megatron_cfg.pipeline_model_parallel_size=2"], NO_GPU, "pipeline parallelism"),
        (["policy.megatron_cfg.context_parallel_size=2"], NO_GPU, "context parallelism"),
    ],
)
def test_megatron_keys_that_cannot_run_here_are_refused(
    overrides: list[str], machine: Machine, refused: str
) -> None:
    assert refused in support_refusals("grpo_math_tiny.yaml", [*MEGATRON, *overrides], machine)


@pytest.mark.parametrize(
    "overrides",
    [
        [*MEGATRON, "policy.megatron_cfg.tensor_model_parallel_size=2"],  # two CPU ranks
        [*MEGATRON, "policy.megatron_cfg.scheduler.lr_decay_iters=null"],  # constant LR
        ["policy.megatron_cfg.optimizer.bf16=true"],  # Megatron does not train
    ],
)
def test_megatron_keys_that_run_here_pass(overrides: list[str]) -> None:
    assert support_refusals("grpo_math_tiny.yaml", overrides, NO_GPU) == ""


@pytest.mark.megatron  # builds megatron-core's TransformerConfig (imports megatron-core)
def test_attention_backend_reaches_the_transformer_config(
    tiny_qwen2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo RL's megatron_cfg.attention_backend: megatron-core's AttnBackend by name, with
    the NVTE_*_ATTN variables cleared first (the model sets them and asserts they agree)."""
    from megatron.core.transformer.enums import AttnBackend
    from transformers import AutoConfig

    from nemo_rl_core.models.megatron.converters import GPTLayout
    from nemo_rl_core.models.megatron.model import transformer_config

    hf_config = AutoConfig.from_pretrained(tiny_qwen2_dir)
    layout = GPTLayout.from_hf_config(hf_config)
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    chosen = MegatronConfig(enabled=True, attention_backend="unfused")
    built = transformer_config(layout, hf_config, chosen, use_te=False)
    assert built.attention_backend is AttnBackend.unfused
    assert "NVTE_FLASH_ATTN" not in os.environ
    default = transformer_config(layout, hf_config, MegatronConfig(enabled=True), use_te=False)
    assert default.attention_backend is AttnBackend.auto
    with pytest.raises(ValidationError, match="attention_backend"):
        MegatronConfig(enabled=True, attention_backend="TRITON_ATTN")
