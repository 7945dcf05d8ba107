"""The ``policy:`` section of a NeMo RL config, as a validated pydantic model.

Keys and defaults follow NeMo RL's ``PolicyConfig`` TypedDict and its example YAMLs
(``examples/configs/grpo_math_1B.yaml``), so a NeMo RL YAML validates unchanged. Unknown
keys fail with their path (``policy.optimizer.kwargs.lrr``) instead of being ignored.
"""

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_rl_core.models.generation.config import GenerationConfig
from nemo_rl_core.models.megatron.config import MegatronConfig
from nemo_rl_core.models.policy.utils import check_kwargs_accepted, import_class_from_path
from nemo_rl_core.utils.key_support import Check, Only, PartOf, SupportContext, Wired

_TOKENIZER = "nemo_rl_core.models.policy.hf_loading:load_tokenizer"


class StrictModel(BaseModel):
    """Base for config sections: unknown keys are errors naming their path."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TokenizerConfig(StrictModel):
    """``tokenizer:`` as NeMo RL's ``get_tokenizer`` reads it. ``chat_template``: absent or
    ``"default"`` keeps the tokenizer's own template, ``null`` the plain passthrough one, any
    other string is a Jinja template or a ``.jinja`` file; ``chat_template_kwargs`` go to
    every ``apply_chat_template`` call (``enable_thinking: true``)."""

    name: Annotated[str | None, Wired(_TOKENIZER)] = None  # None: the model's model_name
    chat_template: Annotated[str | None, Wired(_TOKENIZER)] = "default"
    chat_template_kwargs: Annotated[dict[str, Any] | None, Wired(_TOKENIZER)] = None


class OptimizerConfig(StrictModel):
    """A torch optimizer by dotted class name; ``kwargs`` go to its constructor."""

    name: str = "torch.optim.AdamW"
    kwargs: dict[str, Any] = Field(
        default_factory=lambda: {
            "lr": 5.0e-6,
            "weight_decay": 0.01,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "foreach": False,
            "fused": False,
        }
    )

    @model_validator(mode="after")
    def _kwargs_fit_class(self) -> Self:
        check_kwargs_accepted(import_class_from_path(self.name), self.kwargs, skip=1)
        return self


class SchedulerConfig(StrictModel):
    """One ``torch.optim.lr_scheduler`` class by dotted name, with its kwargs."""

    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kwargs_fit_class(self) -> Self:
        check_kwargs_accepted(import_class_from_path(self.name), self.kwargs, skip=1)
        return self


class SchedulerMilestones(StrictModel):
    """The step indices where a ``SequentialLR`` switches to the next scheduler."""

    milestones: list[int]


SchedulerEntry = SchedulerConfig | SchedulerMilestones


class DynamicBatchingConfig(StrictModel):
    """Microbatches by token budget instead of sample count (sorted by length)."""

    enabled: bool = False
    train_mb_tokens: int | None = None  # None: max_total_sequence_length * train_micro_batch_size
    logprob_mb_tokens: int | None = None  # None: max_total_sequence_length * logprob_batch_size
    sequence_length_round: int = Field(64, ge=1)


class SequencePackingConfig(StrictModel):
    """Several sequences concatenated into one row with position-id resets."""

    enabled: bool = False
    train_mb_tokens: int | None = None
    logprob_mb_tokens: int | None = None
    algorithm: Literal[
        "modified_first_fit_decreasing", "first_fit_decreasing", "first_fit_shuffle"
    ] = "modified_first_fit_decreasing"
    sequence_length_round: int = Field(64, ge=1)


_LORA_READER = "nemo_rl_core.models.policy.lora:peft_config"


def _lora_on_hf_backend(enabled: bool, context: SupportContext) -> str | None:
    if enabled and context.value("policy.training_backend") == "megatron":
        return (
            "dtensor_cfg.lora_cfg configures the HF backend; with megatron_cfg.enabled the "
            "Megatron backend trains, whose LoRA (megatron_cfg.peft) is not built"
        )
    return None


def _peft_dropout_position(position: str, context: SupportContext) -> str | None:
    dropout = context.value("policy.dtensor_cfg.lora_cfg.dropout") or 0.0
    if position == "post" and dropout > 0:
        return "peft applies LoRA dropout to the adapter's input: set dropout_position: pre"
    return None


class LoraConfig(StrictModel):
    """``dtensor_cfg.lora_cfg``: LoRA adapters on every (or the named) linear layer."""

    enabled: Annotated[
        bool, Check(_lora_on_hf_backend, "adapters through peft on the HF backend")
    ] = False
    target_modules: Annotated[list[str], Wired(_LORA_READER)] = Field(default_factory=list)
    exclude_modules: Annotated[list[str], Wired(_LORA_READER)] = Field(default_factory=list)
    match_all_linear: Annotated[bool, Wired(_LORA_READER)] = True
    dim: Annotated[int, Wired(_LORA_READER)] = Field(8, ge=1)
    alpha: Annotated[int, Wired(_LORA_READER)] = 32
    dropout: Annotated[float, Wired(_LORA_READER)] = Field(0.0, ge=0.0, lt=1.0)
    dropout_position: Annotated[
        Literal["pre", "post"], Check(_peft_dropout_position, "pre, or post without dropout")
    ] = "post"
    lora_A_init: Annotated[
        Literal["xavier", "uniform"], Wired("nemo_rl_core.models.policy.lora:add_adapters")
    ] = "xavier"
    use_triton: Annotated[
        bool,
        Check(
            lambda value, context: None,
            "Triton LoRA kernels on GPU; the torch path here computes the same adapters",
        ),
    ] = True


class DTensorConfig(StrictModel):
    """FSDP2/DTensor knobs of NeMo RL; accepted so YAMLs validate, single-process here."""

    enabled: bool = True
    v2: bool = Field(True, alias="_v2")
    cpu_offload: bool = False
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    tensor_parallel_size: int = Field(1, ge=1)
    context_parallel_size: int = Field(1, ge=1)
    custom_parallel_plan: str | None = None
    clear_cache_every_n_steps: int | None = None
    env_vars: dict[str, str] = Field(default_factory=dict)
    lora_cfg: LoraConfig | None = None
    automodel_kwargs: Annotated[
        dict[str, Any],
        Only(
            {},
            reason="options of NeMo Automodel's loader; models load through transformers "
            "here (policy.hf_config_overrides sets model config values)",
        ),
    ] = Field(default_factory=dict)


_DRAFT = "policy.draft.enabled"


class DraftConfig(StrictModel):
    """``policy.draft``: an Eagle-style draft head trained beside the policy."""

    enabled: Annotated[
        bool,
        Only(False, reason="draft-head training (DraftCrossEntropyLossFn) has no flow yet"),
    ] = False
    model_name: Annotated[str | None, PartOf(_DRAFT)] = None
    loss_weight: Annotated[float, PartOf(_DRAFT)] = 0.1
    num_layers: Annotated[int | None, PartOf(_DRAFT)] = None
    aux_layer_indices: Annotated[list[int] | None, PartOf(_DRAFT)] = None


class TrainedModelConfig(StrictModel):
    """The keys every trained HF model shares (policy and value): model, batches, optimizer."""

    model_name: str
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    train_global_batch_size: int = Field(ge=1)
    train_micro_batch_size: int = Field(ge=1)
    logprob_batch_size: int | None = Field(None, ge=1)  # None: train_micro_batch_size
    max_total_sequence_length: int = Field(ge=2)
    precision: Literal["float32", "bfloat16"] = "bfloat16"
    hf_config_overrides: dict[str, Any] = Field(default_factory=dict)
    # null in NeMo RL's Megatron YAMLs: megatron_cfg.optimizer serves that backend
    optimizer: OptimizerConfig | None = Field(default_factory=OptimizerConfig)
    scheduler: Annotated[list[SchedulerEntry] | SchedulerConfig | None, Field()] = None
    max_grad_norm: float | None = 1.0
    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig)
    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    make_sequence_length_divisible_by: int = Field(1, ge=1)
    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    megatron_cfg: MegatronConfig | None = None
    training_backend: Literal["hf", "megatron"] = "hf"

    @field_validator("scheduler")
    @classmethod
    def _scheduler_list_shape(cls, value: Any) -> Any:
        """A list is NeMo RL's SequentialLR form: N schedulers and N-1 milestones."""
        if not isinstance(value, list):
            return value
        schedulers = [e for e in value if isinstance(e, SchedulerConfig)]
        milestones = [e.milestones for e in value if isinstance(e, SchedulerMilestones)]
        if not schedulers:
            raise ValueError("the scheduler list names no scheduler (entries with 'name')")
        if len(milestones) > 1:
            raise ValueError("the scheduler list may hold one 'milestones' entry, found several")
        found = milestones[0] if milestones else []
        if len(schedulers) > 1 and len(found) != len(schedulers) - 1:
            raise ValueError(
                f"{len(schedulers)} schedulers need {len(schedulers) - 1} milestones "
                f"in a '- milestones: [...]' entry, got {found}"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _backend_from_megatron_cfg(cls, data: Any) -> Any:
        """NeMo RL picks Megatron with ``megatron_cfg.enabled``; honour it unless told otherwise."""
        if not isinstance(data, dict):
            return data
        megatron = data.get("megatron_cfg")
        enabled = bool(
            megatron.get("enabled")
            if isinstance(megatron, dict)
            else getattr(megatron, "enabled", False)
        )
        backend = data.get("training_backend")
        if enabled and backend is None:
            return {**data, "training_backend": "megatron"}
        if enabled and backend == "hf":
            raise ValueError(
                "megatron_cfg.enabled is true but training_backend is 'hf'; "
                "set one of them consistently"
            )
        return data

    @model_validator(mode="after")
    def _fill_derived(self) -> Self:
        """Fill NeMo RL's YAML interpolations (tokenizer name, token budgets) and check them."""
        if self.dynamic_batching.enabled and self.sequence_packing.enabled:
            raise ValueError(
                "dynamic_batching.enabled and sequence_packing.enabled are both true; "
                "enable at most one"
            )
        if self.train_global_batch_size % self.train_micro_batch_size:
            raise ValueError(
                f"train_global_batch_size={self.train_global_batch_size} is not a multiple "
                f"of train_micro_batch_size={self.train_micro_batch_size}"
            )
        if self.optimizer is None and self.training_backend == "hf":
            raise ValueError(
                "optimizer is null, which only the Megatron backend allows "
                "(megatron_cfg.optimizer); name a torch optimizer for the HF backend"
            )
        if self.tokenizer.name is None:
            self.tokenizer.name = self.model_name
        if self.logprob_batch_size is None:
            self.logprob_batch_size = self.train_micro_batch_size
        for section in (self.dynamic_batching, self.sequence_packing):
            if section.train_mb_tokens is None:
                section.train_mb_tokens = (
                    self.max_total_sequence_length * self.train_micro_batch_size
                )
            if section.logprob_mb_tokens is None:
                section.logprob_mb_tokens = self.max_total_sequence_length * self.logprob_batch_size
        return self


class PolicyConfig(TrainedModelConfig):
    """NeMo RL's ``policy:`` section."""

    generation_batch_size: int | None = Field(None, ge=1)
    logprob_chunk_size: int | None = Field(None, ge=1)
    offload_optimizer_for_logprob: bool = False
    refit_buffer_size_gb: float | None = None
    generation: GenerationConfig | None = None
    draft: DraftConfig = Field(default_factory=DraftConfig)
