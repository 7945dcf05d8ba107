"""The ``policy.generation:`` section of a NeMo RL config, as a validated pydantic model.

Keys and defaults follow NeMo RL's ``GenerationConfig``/``VllmConfig`` and its example
YAMLs (``grpo_math_1B.yaml``), so a NeMo RL ``generation:`` block validates unchanged.
Unknown keys fail with their key path (``vllm_cfg.max_len: Extra inputs are not
permitted``) instead of being silently ignored.
"""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_rl_core.utils.key_support import (
    Check,
    Only,
    PartOf,
    ReadWhile,
    SupportContext,
    Wired,
    inert,
)

_VLLM = "nemo_rl_core.models.generation.vllm_generation:VllmGeneration"
_ENGINE = Wired(f"{_VLLM}._engine_kwargs")
_SAMPLING = Wired(f"{_VLLM}._sampling_params")
_REQUESTS = Wired("nemo_rl_core.models.generation.sequences:build_requests")

# NeMo RL serves generation from Ray actors with HTTP endpoints on these ports; the engine
# here runs inside the stage's own process and opens none, so no range can collide.
NO_SERVER_PORTS = inert(
    "ports for NeMo RL's Ray-hosted generation servers; the engine here runs in the stage's "
    "process and opens no port",
)

Precision = Literal["float32", "bfloat16", "float16", "fp8"]


def _generation_value(context: SupportContext, name: str) -> Any:
    """A key of the generation section that holds the key being checked: ``policy.generation``
    in a training config, ``generation`` in an eval config."""
    section = context.key.split(".vllm_cfg.")[0]
    return context.value(f"{section}.{name}")


def _engine_devices(value: int, context: SupportContext) -> str | None:
    """vLLM's tensor x pipeline parallel engine: one GPU per shard."""
    if value == 1:
        return None
    vllm_cfg = _generation_value(context, "vllm_cfg")
    shards = vllm_cfg.tensor_parallel_size * vllm_cfg.pipeline_parallel_size
    if shards <= context.machine.cuda_devices:
        return None
    return (
        f"a vLLM engine of {shards} shards needs {shards} GPUs, this machine has "
        f"{context.machine.gpus_phrase()}"
    )


_ENGINE_DEVICES = Check(_engine_devices, "vLLM shards: one GPU each must be present")


def _fp8_on_a_gpu_engine(precision: str, context: SupportContext) -> str | None:
    if precision != "fp8":
        return None
    if _generation_value(context, "backend") != "vllm":
        return "fp8 generation is vLLM's quantization; the hf backend runs bfloat16 or float32"
    if context.machine.cuda_devices == 0:
        return "vLLM's fp8 quantization needs a GPU; this machine has none"
    return None


def _runs_the_policy(name: str | None, context: SupportContext) -> str | None:
    policy = context.value("policy.model_name")
    if name is None or name == policy:
        return None
    return (
        f"generation samples from the policy being trained (NeMo RL sets this key to "
        f"policy.model_name={policy!r} too): leave it null or equal"
    )


class _Strict(BaseModel):
    """Base for config sections: unknown keys are errors, field names are the YAML keys."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


_OWN_DEVICES = (
    "devices reserved for generation in NeMo RL's Ray cluster; here the generate stage runs on "
    "the devices of the worker (work pool) it is placed on"
)


class ResourcesConfig(_Strict):
    """Devices reserved for a non-colocated generation engine: NeMo RL reads them only while
    ``colocated.enabled`` is false."""

    read_while: ClassVar[ReadWhile] = ReadWhile(
        lambda section, context: context.sibling_value("enabled") is False, still_read=()
    )

    gpus_per_node: Annotated[int | None, Only(None, reason=_OWN_DEVICES)] = None
    num_nodes: Annotated[int | None, Only(None, reason=_OWN_DEVICES)] = None


class ColocationConfig(_Strict):
    """Whether generation shares devices with training (NeMo RL's default) or has its own:
    a colocated GPU engine sleeps between generations, giving training its memory."""

    enabled: Annotated[bool, Wired(f"{_VLLM}.finish_generation")] = True
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)


_BF16_LAYERS = (
    "keeping layers out of fp8 generation is not built; vllm_cfg.precision: fp8 quantizes "
    "every layer through vLLM"
)
_ENGINE_LOAD_KEY = "policy.generation.vllm_cfg.enable_vllm_metrics_logger"


def _engine_load_reported(enabled: bool, context: SupportContext) -> str | None:
    """The engine's load is sampled per engine and reported by an unsplit generate stage:
    the shards of a split one each sample their own engine, which the merge does not see."""
    if not enabled or not _generation_value(context, "vllm_cfg").async_engine:
        return None
    fan_out = context.value("orchestration.fan_out") or {}
    if fan_out.get("generate", 1) == 1:
        return None
    return (
        "the engine's load is sampled in each shard's process and reported by an unsplit "
        "generate stage; with orchestration.fan_out.generate > 1 set it to false"
    )


_ENGINE_LOAD = Check(
    _engine_load_reported,
    "with async_engine: the generate stage samples vLLM's running and waiting requests "
    "(read by `nemo_rl_core.models.generation.vllm_generation:VllmGeneration.generate`)",
)
_HTTP = "generation.vllm_cfg.expose_http_server"  # from the policy section, or eval's root
_GEN_QUANT = "generation.quant_cfg"


class VllmSpecificArgs(_Strict):
    """``vllm_cfg``: the vLLM engine's arguments (the hf backend reads precision and
    max_model_len, and no other key's rule applies to it; vLLM-CPU takes the GPU-only ones
    and has no use for them)."""

    read_while: ClassVar[ReadWhile] = ReadWhile(
        lambda section, context: context.sibling_value("backend") == "vllm",
        still_read=("precision", "max_model_len"),
    )

    tensor_parallel_size: Annotated[int, _ENGINE_DEVICES] = Field(1, ge=1)
    pipeline_parallel_size: Annotated[int, _ENGINE_DEVICES] = Field(1, ge=1)
    expert_parallel_size: Annotated[
        int,
        Only(
            1,
            reason="vLLM's expert parallelism spans data-parallel engine replicas "
            "(EP = DP x TP); one engine runs here",
        ),
    ] = Field(1, ge=1)
    gpu_memory_utilization: Annotated[float, _ENGINE] = Field(0.6, gt=0.0, le=1.0)
    # None: the model's max_position_embeddings.
    max_model_len: Annotated[
        int | None, Wired("nemo_rl_core.models.generation.model_files:setup_backend")
    ] = Field(None, ge=1)
    precision: Annotated[
        Precision, Check(_fp8_on_a_gpu_engine, "the engine's dtype; fp8 on a vLLM GPU engine")
    ] = "bfloat16"
    enforce_eager: Annotated[bool, _ENGINE] = False
    async_engine: Annotated[
        bool,
        inert(
            "how NeMo RL dispatches rollouts (its async engine takes one request per sample, "
            "which async GRPO needs); here the stage hands vLLM its whole batch in one call and "
            "vLLM's scheduler batches it continuously: the same samples either way",
        ),
    ] = False
    kv_cache_dtype: Annotated[str, _ENGINE] = "auto"
    # False keeps the tokenizer in the engine, which stop_strings need.
    skip_tokenizer_init: Annotated[bool, _ENGINE] = False
    # "dummy" starts NeMo RL's engine with random weights that a refit replaces before it
    # generates; the engine here starts from the step's weights and is not refit first.
    load_format: Annotated[
        Literal["auto", "dummy", "safetensors", "pt"],
        Only(
            "auto",
            "safetensors",
            "pt",
            reason="the engine here loads the step's weights and generates without a refit "
            "first: random ('dummy') weights would be sampled from",
        ),
    ] = "auto"
    hf_overrides: Annotated[dict[str, Any] | None, _ENGINE] = None
    compilation_config: Annotated[dict[str, Any] | None, _ENGINE] = None
    use_deep_gemm: Annotated[
        bool,
        inert(
            "a GPU kernel (DeepGEMM) for fp8 matrix products; vLLM's own kernel here computes "
            "the same products",
        ),
    ] = False
    # In NeMo RL's distillation config: its vLLM worker picks the executor itself.
    distributed_executor_backend: Annotated[
        str | None,
        inert(
            "NeMo RL v0.7 reads it nowhere: its vLLM worker chooses the executor (ray or none) "
            "from the parallel sizes, as the engine here does"
        ),
    ] = None
    num_last_layers_in_bf16: Annotated[int, Only(0, reason=_BF16_LAYERS)] = 0
    num_first_layers_in_bf16: Annotated[int, Only(0, reason=_BF16_LAYERS)] = 0
    # NeMo RL samples the engine's load only from its async engine.
    enable_vllm_metrics_logger: Annotated[bool, _ENGINE_LOAD] = False
    vllm_metrics_logger_interval: Annotated[float, PartOf(_ENGINE_LOAD_KEY)] = Field(0.5, gt=0.0)
    use_tqdm: Annotated[
        bool, Wired("nemo_rl_core.models.generation.vllm_generation:VllmGeneration.generate")
    ] = False
    # None: on where the GPU has compute capability 8 or more (NeMo RL's rule).
    enable_prefix_caching: Annotated[bool | None, _ENGINE] = None
    enable_expert_parallel: Annotated[
        bool | None,
        inert(
            "NeMo RL v0.7 reads it nowhere: its vLLM worker turns expert parallelism on from "
            "expert_parallel_size > 1, as the engine here does",
        ),
    ] = None
    # Set in the stage's process, where the engine runs, before the engine starts.
    env_vars: Annotated[
        dict[str, str] | None, Wired("nemo_rl_core.pipeline.runtime:RunRuntime.generation")
    ] = None
    quantization_ignored_layer_kws: Annotated[list[str], Only([], reason=_BF16_LAYERS)] = Field(
        default_factory=list
    )
    # NeMo RL's OpenAI-compatible HTTP server on its async vLLM engine (NeMo Gym's rollouts).
    expose_http_server: Annotated[
        bool,
        Only(
            False,
            reason="NeMo RL's HTTP server on the vLLM engine serves NeMo Gym, not built; the "
            "engine here runs in the stage's process and opens no port",
        ),
    ] = False
    http_server_serving_chat_kwargs: Annotated[dict[str, Any] | None, PartOf(_HTTP)] = None
    tool_parser_plugin: Annotated[str | None, PartOf(_HTTP)] = None
    reasoning_parser_plugin: Annotated[str | None, PartOf(_HTTP)] = None
    limit_mm_per_prompt: Annotated[
        dict[str, int] | None,
        inert(
            "NeMo RL v0.7 reads it nowhere (its VLM recipes keep it; vLLM's own default "
            "applies); multimodal models are not built here besides",
        ),
    ] = None


class GenerationConfig(_Strict):
    """``policy.generation``: which backend generates rollouts and how it samples."""

    backend: Annotated[
        Literal["vllm", "hf", "sglang", "megatron"],
        Only(
            "vllm",
            "hf",
            reason="generation runs on vLLM (CUDA or CPU build) or transformers here; "
            "SGLang and Megatron inference engines are not built",
        ),
    ] = "vllm"
    # NeMo RL reads it only with backend: sglang (vLLM's is vllm_cfg.async_engine).
    use_async_rollouts: Annotated[bool, PartOf("generation.backend")] = False
    sglang_cfg: Annotated[dict[str, Any] | None, PartOf("policy.generation.backend")] = None
    port_range_low: Annotated[int, NO_SERVER_PORTS] = 11001
    port_range_high: Annotated[int, NO_SERVER_PORTS] = 15000
    # Settings of NeMo RL's Megatron inference engine (``backend: megatron``), which this
    # deployment does not offer: the backend key refuses it.
    mcore_generation_config: Annotated[
        dict[str, Any] | None, PartOf("policy.generation.backend")
    ] = None
    max_new_tokens: Annotated[int, _REQUESTS] = Field(512, ge=1)
    temperature: Annotated[float, _SAMPLING] = Field(1.0, ge=0.0)
    top_p: Annotated[float, _SAMPLING] = Field(1.0, gt=0.0, le=1.0)
    # None or -1: no top-k filtering.
    top_k: Annotated[int | None, _SAMPLING] = None
    model_name: Annotated[
        str | None, Check(_runs_the_policy, "null or policy.model_name: the policy generates")
    ] = None
    # None: the tokenizer's eos token stops generation (NeMo RL fills this in the same way).
    stop_token_ids: Annotated[list[int] | None, _SAMPLING] = None
    stop_strings: Annotated[list[str] | None, _REQUESTS] = None
    # NeMo RL's trainer writes the tokenizer's pad id into ``_pad_token_id``.
    pad_token_id: Annotated[
        int | None, Wired("nemo_rl_core.models.generation.config:configure_generation_config")
    ] = Field(None, validation_alias=AliasChoices("pad_token_id", "_pad_token_id"))
    colocated: ColocationConfig = Field(default_factory=ColocationConfig)
    vllm_cfg: VllmSpecificArgs = Field(default_factory=VllmSpecificArgs)
    # Passed to ``vllm.LLM(...)`` as is, after the keys derived from vllm_cfg.
    vllm_kwargs: Annotated[dict[str, Any], _ENGINE] = Field(default_factory=dict)
    # NeMo RL's ModelOpt-quantized rollouts: a recipe name, and real NVFP4 kernels.
    quant_cfg: Annotated[
        str | None,
        Only(None, reason="ModelOpt-quantized generation is not built here"),
    ] = None
    real_quant: Annotated[bool, PartOf(_GEN_QUANT)] = False
    real_quant_ignore: Annotated[list[str] | None, PartOf(_GEN_QUANT)] = None
    bad_words: Annotated[
        list[str] | None,
        inert("NeMo RL v0.7 reads it nowhere (its sampling parameters leave it out)"),
    ] = None

    @field_validator("top_k")
    @classmethod
    def _top_k_positive_or_disabled(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError(f"top_k must be None, -1 (disabled) or >= 1, got {value}")
        return value

    @model_validator(mode="after")
    def _fits_model_len(self) -> "GenerationConfig":
        max_len = self.vllm_cfg.max_model_len
        if max_len is not None and self.max_new_tokens > max_len:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} exceeds vllm_cfg.max_model_len={max_len}; "
                "lower max_new_tokens or raise max_model_len"
            )
        return self

    @property
    def top_k_filter(self) -> int | None:
        """The k of top-k filtering; None when top_k leaves the distribution unchanged."""
        return None if self.top_k == -1 else self.top_k


def configure_generation_config(
    config: GenerationConfig, tokenizer: Any, is_eval: bool = False
) -> GenerationConfig:
    """Fill the tokenizer-derived keys as NeMo RL's trainer does before building a backend.

    ``pad_token_id`` falls back to the tokenizer's pad (or eos) token, ``stop_token_ids``
    to the eos token, so generation ends where training data ends. ``is_eval`` is kept
    for NeMo RL's signature; here the engine always loads real weights (``load_format``).
    """
    pad = config.pad_token_id
    if pad is None:
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
    if pad is None:
        raise ValueError(
            "generation.pad_token_id: the tokenizer has neither a pad nor an eos token; set it"
        )
    stop_ids = config.stop_token_ids
    if stop_ids is None and tokenizer.eos_token_id is not None:
        stop_ids = [tokenizer.eos_token_id]
    return config.model_copy(update={"pad_token_id": pad, "stop_token_ids": stop_ids})
