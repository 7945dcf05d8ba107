"""The ``policy.generation:`` section of a NeMo RL config, as a validated pydantic model.

Keys and defaults follow NeMo RL's ``GenerationConfig``/``VllmConfig`` and its example
YAMLs (``grpo_math_1B.yaml``), so a NeMo RL ``generation:`` block validates unchanged.
Unknown keys fail with their key path (``vllm_cfg.max_len: Extra inputs are not
permitted``) instead of being silently ignored.
"""

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_rl_core.utils.key_support import Check, Only, PartOf, Wired

# NeMo RL serves generation from Ray actors with HTTP endpoints on these ports; the engine
# here runs inside the stage's own process and opens none, so no range can collide.
NO_SERVER_PORTS = Check(
    lambda value, context: None,
    "ports for NeMo RL's Ray-hosted generation servers; the engine here runs in the stage's "
    "process and opens no port",
)

Precision = Literal["float32", "bfloat16", "float16", "fp8"]


class _Strict(BaseModel):
    """Base for config sections: unknown keys are errors, field names are the YAML keys."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResourcesConfig(_Strict):
    """Devices reserved for a non-colocated generation engine."""

    gpus_per_node: int | None = None
    num_nodes: int | None = None


class ColocationConfig(_Strict):
    """Whether generation shares devices with training (NeMo RL's default) or has its own."""

    enabled: bool = True
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)


class VllmSpecificArgs(_Strict):
    """``vllm_cfg``: engine arguments. On CPU the GPU-only ones are accepted and ignored."""

    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    expert_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.6, gt=0.0, le=1.0)
    # None: the model's max_position_embeddings.
    max_model_len: int | None = Field(None, ge=1)
    precision: Precision = "bfloat16"
    enforce_eager: bool = False
    async_engine: bool = False
    kv_cache_dtype: str = "auto"
    # False keeps the tokenizer in the engine, which stop_strings need.
    skip_tokenizer_init: bool = False
    # "auto" loads model_path; "dummy" starts with random weights that a refit replaces.
    load_format: Literal["auto", "dummy", "safetensors", "pt"] = "auto"
    hf_overrides: dict[str, Any] | None = None
    compilation_config: dict[str, Any] | None = None
    use_deep_gemm: bool = False
    num_last_layers_in_bf16: int = 0
    num_first_layers_in_bf16: int = 0
    enable_vllm_metrics_logger: bool = False
    vllm_metrics_logger_interval: float = 0.5
    use_tqdm: Annotated[
        bool, Wired("nemo_rl_core.models.generation.vllm_generation:VllmGeneration.generate")
    ] = False


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
    use_async_rollouts: Annotated[
        bool, Only(False, reason="asynchronous rollouts come with async GRPO, not built")
    ] = False
    sglang_cfg: Annotated[dict[str, Any] | None, PartOf("policy.generation.backend")] = None
    port_range_low: Annotated[int, NO_SERVER_PORTS] = 11001
    port_range_high: Annotated[int, NO_SERVER_PORTS] = 15000
    # Settings of NeMo RL's Megatron inference engine (``backend: megatron``), which this
    # deployment does not offer: the backend key refuses it.
    mcore_generation_config: Annotated[
        dict[str, Any] | None, PartOf("policy.generation.backend")
    ] = None
    max_new_tokens: int = Field(512, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # None or -1: no top-k filtering.
    top_k: int | None = None
    model_name: str | None = None
    # None: the tokenizer's eos token stops generation (NeMo RL fills this in the same way).
    stop_token_ids: list[int] | None = None
    stop_strings: list[str] | None = None
    # NeMo RL's trainer writes the tokenizer's pad id into ``_pad_token_id``.
    pad_token_id: int | None = Field(
        None, validation_alias=AliasChoices("pad_token_id", "_pad_token_id")
    )
    colocated: ColocationConfig = Field(default_factory=ColocationConfig)
    vllm_cfg: VllmSpecificArgs = Field(default_factory=VllmSpecificArgs)
    # Passed to ``vllm.LLM(...)`` as is, after the keys derived from vllm_cfg.
    vllm_kwargs: dict[str, Any] = Field(default_factory=dict)

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
    def top_k_enabled(self) -> bool:
        """True when top-k filtering changes the sampling distribution."""
        return self.top_k is not None and self.top_k != -1


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
    stop_ids = config.stop_token_ids
    if stop_ids is None and tokenizer.eos_token_id is not None:
        stop_ids = [tokenizer.eos_token_id]
    return config.model_copy(update={"pad_token_id": pad, "stop_token_ids": stop_ids})
