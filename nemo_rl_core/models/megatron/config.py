"""``policy.megatron_cfg``: NeMo RL's Megatron-core training settings, typed.

Keys and defaults follow NeMo RL's example YAMLs (``grpo_math_1B_megatron.yaml``) so a
NeMo RL config validates unchanged. Keys that only matter for features this backend
does not implement (MoE, FP8, pipeline/context parallelism) are accepted at their
neutral values and rejected, naming the key, at any other value.
"""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_rl_core.utils.key_support import (
    Check,
    Only,
    PartOf,
    ReadWhile,
    SupportContext,
    Wired,
    inert,
)

_MODEL = "nemo_rl_core.models.megatron.model:transformer_config"
_WORKER = "nemo_rl_core.models.megatron.worker:MegatronWorker"
_OPTIMIZER = Wired(f"{_WORKER}._build_optimizer")
_DDP = Wired(f"{_WORKER}._wrap")
_MTP = "policy.megatron_cfg.mtp_num_layers"
_PP = "policy.megatron_cfg.pipeline_model_parallel_size"
_DENSE = "expert parallelism needs mixture-of-experts layers; the converter builds dense models"
_NO_PP = "pipeline parallelism is not built on this backend (tensor and data parallelism are)"


def _no_fp8(value: Any, context: Any) -> str | None:
    if value and value.get("enabled"):
        return "FP8 training is not built on this backend; set fp8_cfg.enabled: false"
    return None


_PEFT = "policy.megatron_cfg.peft.enabled"
# Mixture-of-experts knobs: NeMo RL applies them to MoE layers only, and the converter here
# builds dense Llama/Qwen2 models (it refuses an MoE checkpoint), so on every model it loads
# they change nothing, as in NeMo RL on a dense model.
MOE_KNOB = inert(
    "tunes mixture-of-experts layers; dense models only here (the converter refuses MoE), "
    "where NeMo RL ignores it too",
)


def _half_matches_precision(value: bool, context: SupportContext) -> str | None:
    """NeMo RL asserts these agree with ``precision``; the worker sets them from it."""
    flag = context.key.rpartition(".")[2]
    precision = context.section_value("precision")
    wanted = precision == {"bf16": "bfloat16", "fp16": "float16"}[flag]
    if value == wanted:
        return None
    return (
        f"must agree with precision={precision!r} (mixed precision with float32 main weights "
        f"is what the Megatron worker runs, as NeMo RL requires): set it to {wanted}"
    )


def _decay_iters_given(value: int | None, context: SupportContext) -> str | None:
    if value is not None:
        return None
    styles = context.section_value("megatron_cfg.scheduler")
    if styles.lr_decay_style == "constant" and styles.weight_decay_incr_style == "constant":
        return None
    return (
        "null decays over NeMo RL's train_iters (the run's planned steps), which the Megatron "
        "worker here is not given: set the number of decay steps"
    )


def _ranks_fit(value: int, context: SupportContext) -> str | None:
    """TP x DP ranks: processes on CPU (gloo), one CUDA device each on a GPU machine."""
    gpus = context.machine.cuda_devices
    if not gpus:
        return None
    section = context.section_value("megatron_cfg")
    ranks = section.tensor_model_parallel_size * section.data_parallel_size
    if ranks <= gpus:
        return None
    return f"tensor x data parallel = {ranks} ranks need {ranks} GPUs, this machine has {gpus}"


_RANKS = Check(_ranks_fit, "TP x DP ranks: processes on CPU, one GPU each where there is CUDA")
_SAME_LOSS = inert(
    "a fused kernel for the same NLL loss (it saves the logits' memory); the loss here is "
    "computed from the logits, with the same values",
)
_NOT_READ_IN_V07 = inert(
    "NeMo RL v0.7 reads it nowhere; the converter here takes the architecture from config.json",
)
_NOT_READ_MOE = inert(
    "NeMo RL v0.7 reads it nowhere (its Megatron setup does not pass it to the model); "
    "an MoE knob besides, and the converter here builds dense models",
)


class _Strict(BaseModel):
    """Unknown keys fail validation with their path, like every user-facing config here."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MegatronOptimizerConfig(_Strict):
    """``megatron_cfg.optimizer``: fields of megatron-core's ``OptimizerConfig``."""

    optimizer: Annotated[Literal["adam", "sgd"], _OPTIMIZER] = "adam"
    lr: Annotated[float, _OPTIMIZER] = 5.0e-6
    min_lr: Annotated[float, _OPTIMIZER] = 5.0e-7
    weight_decay: Annotated[float, _OPTIMIZER] = 0.01
    bf16: Annotated[bool, Check(_half_matches_precision, "true exactly when precision is bf16")] = (
        False
    )
    fp16: Annotated[bool, Check(_half_matches_precision, "true exactly when precision is fp16")] = (
        False
    )
    params_dtype: Annotated[Literal["float32", "bfloat16", "float16"], _OPTIMIZER] = "float32"
    adam_beta1: Annotated[float, _OPTIMIZER] = 0.9
    adam_beta2: Annotated[float, _OPTIMIZER] = 0.999
    adam_eps: Annotated[float, _OPTIMIZER] = 1e-8
    sgd_momentum: Annotated[float, _OPTIMIZER] = 0.9
    use_distributed_optimizer: Annotated[bool, _OPTIMIZER] = True
    use_precision_aware_optimizer: Annotated[bool, _OPTIMIZER] = True
    # null (NeMo RL's configs write ${policy.max_grad_norm}, which may be null): no clipping,
    # Megatron-core's clip_grad 0.
    clip_grad: Annotated[float | None, _OPTIMIZER] = 1.0
    optimizer_cpu_offload: Annotated[bool, _OPTIMIZER] = False
    optimizer_offload_fraction: Annotated[float, _OPTIMIZER] = 0.0


class MegatronSchedulerConfig(_Strict):
    """``megatron_cfg.scheduler``: megatron-core's ``OptimizerParamScheduler`` arguments.

    ``start_weight_decay``/``end_weight_decay`` default to ``optimizer.weight_decay``
    (NeMo RL writes them as ``${policy.megatron_cfg.optimizer.weight_decay}``).
    """

    start_weight_decay: Annotated[float | None, _OPTIMIZER] = None
    end_weight_decay: Annotated[float | None, _OPTIMIZER] = None
    weight_decay_incr_style: Annotated[Literal["constant", "linear", "cosine"], _OPTIMIZER] = (
        "constant"
    )
    lr_decay_style: Annotated[
        Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"], _OPTIMIZER
    ] = "constant"
    lr_decay_iters: Annotated[
        int | None, Check(_decay_iters_given, "decay steps; null only with constant styles")
    ] = 1000
    lr_warmup_iters: Annotated[int, _OPTIMIZER] = 13
    lr_warmup_init: Annotated[float, _OPTIMIZER] = 5.0e-7
    lr_wsd_decay_iters: Annotated[int | None, _OPTIMIZER] = None
    lr_wsd_decay_style: Annotated[Literal["exponential", "linear", "cosine"] | None, _OPTIMIZER] = (
        None
    )


class DistributedDataParallelSettings(_Strict):
    """``megatron_cfg.distributed_data_parallel_config``: megatron-core's DDP config."""

    grad_reduce_in_fp32: Annotated[bool, _DDP] = False
    overlap_grad_reduce: Annotated[bool, _DDP] = True
    overlap_param_gather: Annotated[bool, _DDP] = True
    average_in_collective: Annotated[bool, _DDP] = True
    use_custom_fsdp: Annotated[
        bool,
        Only(
            False,
            reason="Megatron's own FSDP is not built; this backend shards with Megatron DDP "
            "and the distributed optimizer",
        ),
    ] = False
    data_parallel_sharding_strategy: Annotated[
        Literal["no_shard", "optim", "optim_grads", "optim_grads_params"],
        PartOf("megatron_cfg.distributed_data_parallel_config.use_custom_fsdp"),
    ] = "optim_grads_params"


class MegatronPeftConfig(_Strict):
    """``megatron_cfg.peft``: LoRA adapters on the Megatron backend."""

    enabled: Annotated[
        bool,
        Only(
            False,
            reason="LoRA is built on the HF backend (policy.dtensor_cfg.lora_cfg), not on "
            "Megatron-core",
        ),
    ] = False
    target_modules: Annotated[list[str], PartOf(_PEFT)] = Field(default_factory=list)
    exclude_modules: Annotated[list[str], PartOf(_PEFT)] = Field(default_factory=list)
    dim: Annotated[int, PartOf(_PEFT)] = 8
    alpha: Annotated[int, PartOf(_PEFT)] = 32
    dropout: Annotated[float, PartOf(_PEFT)] = 0.0
    dropout_position: Annotated[Literal["pre", "post"], PartOf(_PEFT)] = "post"
    lora_A_init_method: Annotated[str, PartOf(_PEFT)] = "xavier"
    lora_B_init_method: Annotated[str, PartOf(_PEFT)] = "zero"
    a2a_experimental: Annotated[bool, PartOf(_PEFT)] = False
    lora_dtype: Annotated[str | None, PartOf(_PEFT)] = None


class MegatronConfig(_Strict):
    """``policy.megatron_cfg``. ``enabled`` picks this backend in NeMo RL's YAMLs.

    Two keys are this project's own: ``transformer_impl`` picks the layer spec (``"auto"``
    uses Transformer Engine when CUDA and TE are present, megatron's local spec otherwise),
    and ``data_parallel_size`` says how many data-parallel ranks to launch (NeMo RL derives
    it from the Ray cluster; a policy here has no cluster). World size = TP x DP; above 1
    the ranks run under ``torchrun --standalone``.

    NeMo RL reads the section only while Megatron trains: with the HF backend, no key of it
    but ``enabled`` is checked.
    """

    read_while: ClassVar[ReadWhile] = ReadWhile(
        lambda section, context: context.sibling_value("training_backend") == "megatron"
    )

    enabled: Annotated[
        bool,
        Wired("nemo_rl_core.models.policy.config:TrainedModelConfig._backend_from_megatron_cfg"),
    ] = False
    # The converter has no cache: every load converts the HF checkpoint afresh, which is
    # what ``true`` asks for and gives ``false``'s result.
    force_reconvert_from_hf: Annotated[
        bool, Wired("nemo_rl_core.models.megatron.converters:hf_to_megatron")
    ] = False
    empty_unused_memory_level: Annotated[int, Wired(f"{_WORKER}._empty_unused_memory")] = Field(
        default=0, ge=0, le=2
    )
    activation_checkpointing: Annotated[bool, Wired(_MODEL)] = False
    recompute_granularity: Annotated[Literal["full", "selective"], Wired(_MODEL)] = "full"
    recompute_modules: Annotated[list[str] | None, Wired(_MODEL)] = None
    converter_type: Annotated[str | None, _NOT_READ_IN_V07] = None
    tensor_model_parallel_size: Annotated[int, _RANKS] = Field(default=1, ge=1)
    data_parallel_size: Annotated[int, _RANKS] = Field(default=1, ge=1)
    expert_tensor_parallel_size: Annotated[int, Only(1, reason=_DENSE)] = 1
    expert_model_parallel_size: Annotated[int, Only(1, reason=_DENSE)] = 1
    pipeline_model_parallel_size: Annotated[int, Only(1, reason=_NO_PP)] = 1
    num_layers_in_first_pipeline_stage: Annotated[int | None, PartOf(_PP)] = None
    num_layers_in_last_pipeline_stage: Annotated[int | None, PartOf(_PP)] = None
    context_parallel_size: Annotated[
        int, Only(1, reason="context parallelism is not built on this backend")
    ] = 1
    pipeline_dtype: Annotated[Literal["float32", "bfloat16", "float16"] | None, Wired(_MODEL)] = (
        None
    )
    sequence_parallel: Annotated[bool, Wired(_MODEL)] = False
    freeze_moe_router: Annotated[bool, MOE_KNOB] = True
    moe_router_dtype: Annotated[str | None, MOE_KNOB] = "fp64"
    moe_router_load_balancing_type: Annotated[str, MOE_KNOB] = "none"
    moe_router_bias_update_rate: Annotated[float, MOE_KNOB] = 0.0
    moe_permute_fusion: Annotated[bool, MOE_KNOB] = False
    # Fused kernels: transformer_config turns each on where its kernel exists (GPU, TE).
    apply_rope_fusion: Annotated[bool, Wired(_MODEL)] = True
    bias_activation_fusion: Annotated[bool, Wired(_MODEL)] = True
    defer_fp32_logits: Annotated[
        bool | None,
        inert(
            "when the half-precision logits become float32 (memory only, the same values); "
            "the worker here casts them at once",
        ),
    ] = False
    # NeMo RL's SFT NLL loss through a fused linear + cross-entropy kernel, in chunks.
    use_linear_ce_fusion_loss: Annotated[bool, _SAME_LOSS] = False
    linear_ce_fusion_chunk_size: Annotated[int, _SAME_LOSS] = Field(default=256, ge=1)
    moe_per_layer_logging: Annotated[bool, MOE_KNOB] = False
    moe_enable_deepep: Annotated[bool, MOE_KNOB] = False
    moe_token_dispatcher_type: Annotated[str, MOE_KNOB] = "alltoall"
    moe_shared_expert_overlap: Annotated[bool, MOE_KNOB] = False
    mtp_num_layers: Annotated[
        int, Only(0, reason="multi-token prediction heads are not built on this backend")
    ] = 0
    mtp_loss_scaling_factor: Annotated[float, PartOf(_MTP)] = 0.0
    mtp_use_repeated_layer: Annotated[bool, PartOf(_MTP)] = False
    mtp_detach_heads: Annotated[bool, PartOf(_MTP)] = False
    gradient_accumulation_fusion: Annotated[
        bool,
        Only(False, reason="needs Transformer Engine's fused weight-gradient kernels on GPU"),
    ] = False
    use_fused_weighted_squared_relu: Annotated[bool, MOE_KNOB] = False
    moe_grouped_gemm: Annotated[bool, MOE_KNOB] = False
    moe_flex_dispatcher_backend: Annotated[str | None, MOE_KNOB] = None
    moe_hybridep_num_sms: Annotated[int | None, MOE_KNOB] = None
    hybridep_num_ranks_per_nvlink_domain: Annotated[int | None, MOE_KNOB] = None
    hybridep_use_mnnvl: Annotated[bool | None, MOE_KNOB] = None
    # In NeMo RL's MoE recipes, but its setup copies none of them onto the model config.
    moe_router_enable_expert_bias: Annotated[bool | None, _NOT_READ_MOE] = None
    moe_aux_loss_coeff: Annotated[float | None, _NOT_READ_MOE] = None
    track_moe_metrics: Annotated[bool | None, _NOT_READ_MOE] = None
    # megatron-core's AttnBackend by name; null keeps Transformer Engine's own choice.
    attention_backend: Annotated[
        Literal["flash", "fused", "unfused", "local", "auto"] | None, Wired(_MODEL)
    ] = None
    peft: MegatronPeftConfig = Field(default_factory=MegatronPeftConfig)
    transformer_impl: Annotated[
        Literal["auto", "local", "transformer_engine"],
        Wired("nemo_rl_core.models.megatron.model:use_transformer_engine"),
    ] = "auto"
    optimizer: MegatronOptimizerConfig = Field(default_factory=MegatronOptimizerConfig)
    scheduler: MegatronSchedulerConfig = Field(default_factory=MegatronSchedulerConfig)
    distributed_data_parallel_config: DistributedDataParallelSettings = Field(
        default_factory=DistributedDataParallelSettings
    )
    fp8_cfg: Annotated[dict[str, Any] | None, Check(_no_fp8, "FP8 training is not built")] = None
    # Set in the stage's process, which the ranks torchrun starts inherit.
    env_vars: Annotated[
        dict[str, str] | None, Wired("nemo_rl_core.pipeline.runtime:training_env_vars")
    ] = None

    @property
    def weight_decay_range(self) -> tuple[float, float]:
        """(start, end) weight decay with NeMo RL's fallback to ``optimizer.weight_decay``."""
        wd = self.optimizer.weight_decay
        start = (
            wd if self.scheduler.start_weight_decay is None else self.scheduler.start_weight_decay
        )
        end = wd if self.scheduler.end_weight_decay is None else self.scheduler.end_weight_decay
        return start, end
