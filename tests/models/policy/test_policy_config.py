"""PolicyConfig accepts NeMo RL's policy: section and names the key of every mistake."""

import re

import pytest
from policy_testing import NO_GPU, ONE_GPU, support_refusals

from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.utils.config import ConfigError, validate_config
from nemo_rl_core.utils.key_support import Machine

BASE = {
    "model_name": "tiny-llama",
    "train_global_batch_size": 8,
    "train_micro_batch_size": 2,
    "max_total_sequence_length": 128,
}

NEMO_RL_POLICY = {
    **BASE,
    "tokenizer": {"name": "tiny-llama", "chat_template_kwargs": None},
    "hf_config_overrides": {},
    "generation_batch_size": 32,
    "logprob_batch_size": 4,
    "precision": "bfloat16",
    "logprob_chunk_size": None,
    "dtensor_cfg": {
        "_v2": True,
        "enabled": True,
        "cpu_offload": False,
        "sequence_parallel": False,
        "activation_checkpointing": False,
        "tensor_parallel_size": 1,
        "context_parallel_size": 1,
        "custom_parallel_plan": None,
    },
    "megatron_cfg": {"enabled": False},
    "dynamic_batching": {
        "enabled": False,
        "train_mb_tokens": 256,
        "logprob_mb_tokens": 512,
        "sequence_length_round": 64,
    },
    "sequence_packing": {
        "enabled": True,
        "train_mb_tokens": 256,
        "logprob_mb_tokens": 512,
        "algorithm": "modified_first_fit_decreasing",
        "sequence_length_round": 64,
    },
    "make_sequence_length_divisible_by": 1,
    "max_grad_norm": 1.0,
    "optimizer": {
        "name": "torch.optim.AdamW",
        "kwargs": {"lr": 5.0e-6, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8},
    },
    "scheduler": [
        {
            "name": "torch.optim.lr_scheduler.LinearLR",
            "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 50},
        },
        {
            "name": "torch.optim.lr_scheduler.ConstantLR",
            "kwargs": {"factor": 1.0, "total_iters": 10000000000},
        },
        {"milestones": [50]},
    ],
    "generation": {"backend": "hf", "max_new_tokens": 16, "temperature": 1.0},
}


def test_nemo_rl_policy_section_validates_unchanged() -> None:
    config = PolicyConfig.model_validate(NEMO_RL_POLICY)
    assert config.sequence_packing.enabled
    assert config.training_backend == "hf"
    assert config.generation is not None and config.generation.backend == "hf"


def test_derived_defaults_follow_nemo_rl_interpolations() -> None:
    config = PolicyConfig.model_validate(BASE)
    assert config.tokenizer.name == "tiny-llama"
    assert config.logprob_batch_size == 2
    assert config.dynamic_batching.train_mb_tokens == 128 * 2
    assert config.optimizer.name == "torch.optim.AdamW"


def test_megatron_enabled_selects_megatron_backend() -> None:
    config = PolicyConfig.model_validate({**BASE, "megatron_cfg": {"enabled": True}})
    assert config.training_backend == "megatron"
    with pytest.raises(ValueError, match="training_backend"):
        PolicyConfig.model_validate(
            {**BASE, "megatron_cfg": {"enabled": True}, "training_backend": "hf"}
        )


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"dtensor_cfg": {"tensor_paralel_size": 2}}, "dtensor_cfg.tensor_paralel_size"),
        ({"precision": "float64"}, "precision"),
        ({"train_micro_batch_size": 3}, "train_global_batch_size"),
        (
            {"dynamic_batching": {"enabled": True}, "sequence_packing": {"enabled": True}},
            "enable at most one",
        ),
        (
            {"scheduler": [{"name": "torch.optim.lr_scheduler.LinearLR"}] * 2},
            "milestones",
        ),
    ],
)
def test_bad_keys_are_named(override: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        validate_config(PolicyConfig, {**BASE, **override}, source="policy")


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"optimizer": {"kwargs": {"lrr": 1e-3}}}, "policy.optimizer: kwargs ['lrr']"),
        ({"optimizer": {"name": "torch.optim.NoSuchOpt"}}, "NoSuchOpt"),
        (
            {"optimizer": {"name": "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam"}},
            "torch.optim.AdamW is FusedAdam's update",
        ),
        (
            {"scheduler": {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factr": 1}}},
            "policy.scheduler: kwargs ['factr']",
        ),
    ],
)
def test_torch_classes_are_checked_after_the_schema(override: dict, named: str) -> None:
    """The optimizer's and schedulers' kwargs against torch's classes: a step of its own,
    which the config check runs last (it loads torch; the schema does not)."""
    config = validate_config(PolicyConfig, {**BASE, **override}, source="policy")
    with pytest.raises(ConfigError, match=re.escape(named)):
        config.check_torch_classes("policy")


@pytest.mark.parametrize(
    ("overrides", "machine", "refused"),
    [
        (
            ["policy.dtensor_cfg.tensor_parallel_size=2"],
            ONE_GPU,
            "policy.dtensor_cfg.tensor_parallel_size=2: tensor parallelism over 2 ranks needs "
            "a training world that is a multiple of 2; cluster.num_nodes x "
            "cluster.gpus_per_node (processes per node on CPU) = 1",
        ),
        (["policy.dtensor_cfg.context_parallel_size=2"], NO_GPU, "context parallelism"),
        (["policy.dtensor_cfg.enabled=false"], NO_GPU, "NeMo RL has no training backend"),
        (["policy.megatron_cfg.enabled=true"], NO_GPU, "dtensor_cfg.enabled=True: Megatron-core"),
        (["policy.dtensor_cfg.cpu_offload=true"], ONE_GPU, "CPU offload of parameters is not"),
        (
            ["policy.megatron_cfg.enabled=true", "policy.sequence_packing.enabled=true"],
            NO_GPU,
            "policy.sequence_packing.enabled=True: sequence packing is built on the HF",
        ),
        (
            ["+policy.dtensor_cfg.expert_parallel_size=8"],
            ONE_GPU,
            "policy.dtensor_cfg.expert_parallel_size=8: expert parallelism (MoE) is not built",
        ),
        (["+policy.router_replay.enabled=true"], NO_GPU, "router_replay.enabled=True: router"),
        (["+policy.quant_cfg=NVFP4_DEFAULT_CFG"], NO_GPU, "policy.quant_cfg='NVFP4_DEFAULT_CFG'"),
        (["+policy.dequantize_base_checkpoint=true"], NO_GPU, "MXFP4"),
        (["+policy.tokenizer.use_processor=true"], NO_GPU, "text LLMs only"),
        (
            ["+policy.dtensor_cfg.automodel_kwargs.use_liger_kernel=true"],
            NO_GPU,
            "automodel_kwargs={'use_liger_kernel': True}: use_liger_kernel=True: this loader "
            "takes False",
        ),
        (
            ["+policy.dtensor_cfg.automodel_kwargs.backend.attn=te"],
            NO_GPU,
            "backend: an option of NeMo Automodel's loader",
        ),
    ],
)
def test_policy_keys_that_cannot_run_here_are_refused(
    overrides: list[str], machine: Machine, refused: str
) -> None:
    assert refused in support_refusals("grpo_math_tiny.yaml", overrides, machine)


@pytest.mark.parametrize(
    "overrides",
    [
        ["policy.dtensor_cfg.cpu_offload=true", "policy.offload_optimizer_for_logprob=true"],
        [
            "policy.megatron_cfg.enabled=true",
            "policy.dtensor_cfg.enabled=false",
            "policy.offload_optimizer_for_logprob=true",
        ],
        [
            "policy.dtensor_cfg.sequence_parallel=true",
            "policy.dtensor_cfg.activation_checkpointing=true",
        ],
        ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"],
        # transformers' own classes (what this loader builds) and the attention it is given
        [
            "+policy.dtensor_cfg.automodel_kwargs.force_hf=true",
            "+policy.dtensor_cfg.automodel_kwargs.attn_implementation=eager",
        ],
    ],
)
def test_policy_keys_that_run_here_pass(overrides: list[str]) -> None:
    """Host memory offload is moot without CUDA; sequence parallelism tunes TP, which is 1."""
    assert support_refusals("grpo_math_tiny.yaml", overrides, NO_GPU) == ""


@pytest.mark.parametrize(
    "backend", [[], ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]]
)
def test_both_backends_offload_their_optimizer_for_logprobs_on_a_gpu(backend: list[str]) -> None:
    overrides = [*backend, "policy.offload_optimizer_for_logprob=true"]
    assert support_refusals("grpo_math_tiny.yaml", overrides, ONE_GPU) == ""


def test_value_model_reads_the_policy_tokenizer() -> None:
    overrides = ["value.tokenizer.chat_template=null"]
    refused = support_refusals("ppo_tiny.yaml", overrides, NO_GPU)
    assert (
        "value.tokenizer.chat_template=None: the value model reads the policy's tokens" in refused
    )
    assert "policy.tokenizer.chat_template='default'" in refused


def test_packing_algorithm_is_read_only_while_packing_is_on() -> None:
    """NeMo RL's MoE recipes keep an unknown packer name with packing off, which it never
    reads; with packing on its packer refuses the name, and so does the schema here."""
    off = {"sequence_packing": {"enabled": False, "algorithm": "modified_ffd"}}
    assert validate_config(PolicyConfig, {**BASE, **off}).sequence_packing.algorithm
    on = {"sequence_packing": {"enabled": True, "algorithm": "modified_ffd"}}
    with pytest.raises(ConfigError, match="sequence_packing: .*'modified_ffd' is not a packer"):
        validate_config(PolicyConfig, {**BASE, **on}, source="policy")
    upper = {"sequence_packing": {"enabled": True, "algorithm": "FIRST_FIT_SHUFFLE"}}
    validate_config(PolicyConfig, {**BASE, **upper})  # any case, as NeMo RL's get_packer
