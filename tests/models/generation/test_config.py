"""GenerationConfig accepts NeMo RL's generation block and names bad keys by path."""

import pytest
from policy_testing import NO_GPU, ONE_GPU, support_refusals
from pydantic import ValidationError

from nemo_rl_core.models.generation.config import GenerationConfig
from nemo_rl_core.models.generation.vllm_generation import prefix_caching_enabled
from nemo_rl_core.utils.key_support import Machine

NEMO_RL_GRPO_GENERATION = {
    "backend": "vllm",
    "max_new_tokens": 512,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": None,
    "stop_token_ids": None,
    "stop_strings": None,
    "vllm_cfg": {
        "async_engine": False,
        "precision": "bfloat16",
        "kv_cache_dtype": "auto",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "expert_parallel_size": 1,
        "gpu_memory_utilization": 0.6,
        "max_model_len": 512,
        "enforce_eager": False,
        "use_deep_gemm": False,
        "num_last_layers_in_bf16": 0,
        "num_first_layers_in_bf16": 0,
        "enable_vllm_metrics_logger": True,
        "vllm_metrics_logger_interval": 0.5,
    },
    "vllm_kwargs": {},
    "colocated": {"enabled": True, "resources": {"gpus_per_node": None, "num_nodes": None}},
}


def test_nemo_rl_block_validates_unchanged() -> None:
    config = GenerationConfig.model_validate(NEMO_RL_GRPO_GENERATION)
    assert config.vllm_cfg.max_model_len == 512
    assert config.colocated.enabled
    assert config.top_k_filter is None


def test_private_pad_token_key_is_accepted() -> None:
    assert GenerationConfig.model_validate({"_pad_token_id": 7}).pad_token_id == 7


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ({"vllm_cfg": {"max_len": 3}}, "vllm_cfg.max_len"),
        ({"colocated": {"resources": {"gpus": 1}}}, "colocated.resources.gpus"),
        ({"backend": "trtllm"}, "backend"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"vllm_cfg": {"precision": "int3"}}, "vllm_cfg.precision"),
    ],
)
def test_bad_keys_are_named_by_path(override: dict, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        GenerationConfig.model_validate(override)
    assert path in str(info.value)


def test_max_new_tokens_must_fit_model_len() -> None:
    with pytest.raises(
        ValidationError, match="max_new_tokens=600 exceeds vllm_cfg.max_model_len=512"
    ):
        GenerationConfig.model_validate({"max_new_tokens": 600, "vllm_cfg": {"max_model_len": 512}})


GEN = "policy.generation"


@pytest.mark.parametrize(
    ("overrides", "machine", "refused"),
    [
        (
            [f"{GEN}.vllm_cfg.tensor_parallel_size=2"],
            ONE_GPU,
            "tensor_parallel_size=2: a vLLM engine of 2 shards needs 2 GPUs, this machine has 1",
        ),
        ([f"{GEN}.backend=sglang"], NO_GPU, "SGLang and Megatron inference engines"),
        ([f"{GEN}.vllm_cfg.load_format=dummy"], NO_GPU, "random ('dummy') weights"),
        ([f"{GEN}.vllm_cfg.precision=fp8"], NO_GPU, "fp8 quantization needs a GPU"),
        ([f"{GEN}.backend=hf", f"{GEN}.vllm_cfg.precision=fp8"], ONE_GPU, "the hf backend"),
        (
            [
                f"{GEN}.vllm_cfg.async_engine=true",
                f"{GEN}.vllm_cfg.enable_vllm_metrics_logger=true",
                "+orchestration.fan_out.generate=2",
            ],
            NO_GPU,
            "orchestration.fan_out.generate > 1",
        ),
        ([f"{GEN}.vllm_cfg.expert_parallel_size=2"], NO_GPU, "expert parallelism"),
        ([f"{GEN}.vllm_cfg.num_last_layers_in_bf16=1"], NO_GPU, "out of fp8 generation"),
        (
            [f"{GEN}.colocated.enabled=false", f"{GEN}.colocated.resources.gpus_per_node=1"],
            NO_GPU,
            "reserved for generation",
        ),
        ([f"{GEN}.model_name=other-model"], NO_GPU, "samples from the policy being trained"),
        ([f"+{GEN}.vllm_cfg.quantization_ignored_layer_kws=[a]"], NO_GPU, "out of fp8"),
        ([f"+{GEN}.vllm_cfg.expose_http_server=true"], NO_GPU, "serves NeMo Gym"),
        ([f"+{GEN}.quant_cfg=NVFP4_DEFAULT_CFG"], NO_GPU, "ModelOpt-quantized generation"),
    ],
)
def test_generation_keys_that_cannot_run_here_are_refused(
    overrides: list[str], machine: Machine, refused: str
) -> None:
    assert refused in support_refusals("grpo_math_tiny.yaml", overrides, machine)


@pytest.mark.parametrize(
    "overrides",
    [
        # vllm_cfg is not read while transformers generates (but for precision, max_model_len)
        [f"{GEN}.backend=hf", f"{GEN}.vllm_cfg.tensor_parallel_size=2"],
        [f"{GEN}.backend=hf", f"{GEN}.vllm_cfg.async_engine=true"],
        # how NeMo RL dispatches rollouts; vLLM batches the stage's batch continuously here
        [f"{GEN}.vllm_cfg.async_engine=true"],
        # the generate stage samples the engine's load and reports it
        [f"{GEN}.vllm_cfg.async_engine=true", f"{GEN}.vllm_cfg.enable_vllm_metrics_logger=true"],
        # NeMo RL samples the load only from its async engine
        [f"{GEN}.vllm_cfg.enable_vllm_metrics_logger=true", "+orchestration.fan_out.generate=2"],
        # resources are read only where generation has devices of its own
        [f"{GEN}.colocated.resources.gpus_per_node=1"],
        # set in the stage's process, where the engine runs (NeMo RL: its worker's)
        [f"+{GEN}.vllm_cfg.env_vars.VLLM_X=abc"],
    ],
)
def test_generation_keys_nemo_rl_would_not_read_or_honours_run(overrides: list[str]) -> None:
    assert support_refusals("grpo_math_tiny.yaml", overrides, ONE_GPU) == ""


def test_sharded_vllm_engines_run_where_the_gpus_are() -> None:
    overrides = [
        f"{GEN}.vllm_cfg.tensor_parallel_size=2",
        f"{GEN}.vllm_cfg.pipeline_parallel_size=2",
    ]
    assert support_refusals("grpo_math_tiny.yaml", overrides, Machine(cuda_devices=4)) == ""
    assert "4 shards needs 4 GPUs" in support_refusals(
        "grpo_math_tiny.yaml", overrides, Machine(cuda_devices=2)
    )


def test_prefix_caching_is_resolved_as_nemo_rl_does() -> None:
    """A set value reaches the engine; null is NeMo RL's GPU rule, vLLM's default on CPU."""
    assert prefix_caching_enabled(False, on_gpu=True) is False
    assert prefix_caching_enabled(True, on_gpu=False) is True
    assert prefix_caching_enabled(None, on_gpu=False) is None
