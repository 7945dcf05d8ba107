"""The ``policy:`` section of a NeMo RL config, as a validated pydantic model.

Keys and defaults follow NeMo RL's ``PolicyConfig`` TypedDict and its example YAMLs
(``examples/configs/grpo_math_1B.yaml``), so a NeMo RL YAML validates unchanged. Unknown
keys fail with their path (``policy.optimizer.kwargs.lrr``) instead of being ignored.
"""

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_rl_core.data.packing.algorithms import PackingAlgorithm
from nemo_rl_core.models.generation.config import GenerationConfig
from nemo_rl_core.models.megatron.config import MegatronConfig
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import (
    Check,
    Only,
    PartOf,
    ReadWhile,
    SupportContext,
    Wired,
    gpu_memory_knob,
    inert,
    read_while_enabled,
)

_TRAINER = "nemo_rl_core.models.policy.hf_trainer:HFTrainable"
_TOKENIZER = "nemo_rl_core.models.policy.hf_loading:build_tokenizer"
_OPTIM = "nemo_rl_core.models.policy.optim"
_TEXT_ONLY = "multimodal (audio, video, image) models are not built here; text LLMs only"


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
    # NeMo RL's multimodal processor settings (AutoProcessor for audio and video models).
    audio: Annotated[dict[str, Any] | None, Only(None, reason=_TEXT_ONLY)] = None
    video: Annotated[dict[str, Any] | None, Only(None, reason=_TEXT_ONLY)] = None
    use_processor: Annotated[bool, Only(False, reason=_TEXT_ONLY)] = False


class OptimizerConfig(StrictModel):
    """A torch optimizer by dotted class name; ``kwargs`` go to its constructor."""

    name: Annotated[str, Wired(f"{_OPTIM}:build_optimizer")] = "torch.optim.AdamW"
    kwargs: Annotated[dict[str, Any], Wired(f"{_OPTIM}:build_optimizer")] = Field(
        default_factory=lambda: {
            "lr": 5.0e-6,
            "weight_decay": 0.01,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "foreach": False,
            "fused": False,
        }
    )


class SchedulerConfig(StrictModel):
    """One ``torch.optim.lr_scheduler`` class by dotted name, with its kwargs."""

    name: Annotated[str, Wired(f"{_OPTIM}:build_scheduler")]
    kwargs: Annotated[dict[str, Any], Wired(f"{_OPTIM}:build_scheduler")] = Field(
        default_factory=dict
    )


class SchedulerMilestones(StrictModel):
    """The step indices where a ``SequentialLR`` switches to the next scheduler."""

    milestones: Annotated[list[int], Wired(f"{_OPTIM}:build_scheduler")]


SchedulerEntry = SchedulerConfig | SchedulerMilestones


def _hf_backend_only(feature: str, why: str = "") -> Check:
    """A microbatching feature the HF trainer builds and the Megatron worker does not."""

    def test(enabled: bool, context: SupportContext) -> str | None:
        if enabled and context.section_value("training_backend") == "megatron":
            return f"{feature} is built on the HF training backend, not on Megatron-core{why}"
        return None

    return Check(test, f"{feature} on the HF training backend (refused on Megatron)")


_PLAN = Wired(f"{_TRAINER}.plan")  # and, for dynamic batching, MegatronWorker._microbatches


class DynamicBatchingConfig(StrictModel):
    """Microbatches by token budget instead of sample count (sorted by length), on either
    backend (the HF trainer's ``plan``, the Megatron worker's ``_microbatches``)."""

    read_while: ClassVar[ReadWhile] = ReadWhile(read_while_enabled)

    enabled: Annotated[bool, _PLAN] = False
    # None: max_total_sequence_length * train_micro_batch_size (logprob_batch_size)
    train_mb_tokens: Annotated[int | None, _PLAN] = None
    logprob_mb_tokens: Annotated[int | None, _PLAN] = None
    sequence_length_round: Annotated[int, _PLAN] = Field(64, ge=1)


class SequencePackingConfig(StrictModel):
    """Several sequences concatenated into one row with position-id resets."""

    read_while: ClassVar[ReadWhile] = ReadWhile(read_while_enabled)

    enabled: Annotated[
        bool,
        _hf_backend_only(
            "sequence packing",
            " (Megatron-core attends within packed sequences through Transformer Engine, a "
            "CUDA build; its local attention refuses them)",
        ),
    ] = False
    train_mb_tokens: Annotated[int | None, _PLAN] = None
    logprob_mb_tokens: Annotated[int | None, _PLAN] = None
    # A packer's name in any case (``get_packer``); read only while packing is on, as in
    # NeMo RL, whose MoE recipes keep an unknown name ("modified_ffd") with packing off.
    algorithm: Annotated[str, _PLAN] = "modified_first_fit_decreasing"
    sequence_length_round: Annotated[int, Wired(f"{_TRAINER}.layout")] = Field(64, ge=1)
    # NeMo RL's Megatron worker computes the loss of packed rows in one fused call (the
    # same loss); its DTensor worker, which the HF backend is, does not read it.
    fuse_loss: Annotated[bool, PartOf("sequence_packing.enabled")] = False

    @model_validator(mode="after")
    def _known_algorithm(self) -> Self:
        """NeMo RL's packer refuses an unknown name at the first packed batch; refuse it
        here before any work, but only while packing is on (NeMo RL never reads it off)."""
        names = {algorithm.value for algorithm in PackingAlgorithm}
        if self.enabled and self.algorithm.lower() not in names:
            raise ValueError(
                f"algorithm {self.algorithm!r} is not a packer; use one of {sorted(names)}"
            )
        return self


_LORA_READER = "nemo_rl_core.models.policy.lora:peft_config"


def _peft_dropout_position(position: str, context: SupportContext) -> str | None:
    dropout = context.value("policy.dtensor_cfg.lora_cfg.dropout") or 0.0
    if position == "post" and dropout > 0:
        return "peft applies LoRA dropout to the adapter's input: set dropout_position: pre"
    return None


class LoraConfig(StrictModel):
    """``dtensor_cfg.lora_cfg``: LoRA adapters on every (or the named) linear layer. With the
    Megatron backend, ``dtensor_cfg`` is not read at all (as in NeMo RL)."""

    read_while: ClassVar[ReadWhile] = ReadWhile(read_while_enabled)

    enabled: Annotated[bool, Wired("nemo_rl_core.models.policy.hf_policy:HFPolicy")] = False
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
        inert(
            "Triton LoRA kernels on GPU; the torch path here computes the same adapters",
        ),
    ] = True


def _dtensor_or_megatron(enabled: bool, context: SupportContext) -> str | None:
    """Exactly one backend, as NeMo RL's Policy requires: the HF one is its DTensor worker."""
    megatron = context.section_value("training_backend") == "megatron"
    if enabled and megatron:
        return "Megatron-core trains, and NeMo RL takes one backend: set dtensor_cfg.enabled: false"
    if not enabled and not megatron:
        return (
            "with megatron_cfg.enabled false too, NeMo RL has no training backend; the HF "
            "backend here is its DTensor worker: set dtensor_cfg.enabled: true"
        )
    return None


_TP = "dtensor_cfg.tensor_parallel_size"
_ONE_PROCESS = (  # what the HF backend does across ranks
    "the HF backend shards over FSDP2 (or HSDP) x tensor parallelism only "
    "(cluster.num_nodes x cluster.gpus_per_node ranks, dtensor_cfg.tensor_parallel_size)"
)


def training_ranks(context: SupportContext) -> int:
    """The training stage's world size as the config's ``cluster:`` asks for it."""
    nodes = context.value("cluster.num_nodes") or 1
    return int(nodes) * max(int(context.value("cluster.gpus_per_node") or 0), 1)


def _tp_divides_world(value: int, context: SupportContext) -> str | None:
    """TP spans the training ranks (the policy's, the value model's, and the teacher's, whose
    stage runs on them too): it must divide their number."""
    if value == 1:
        return None
    world = training_ranks(context)
    if world % value == 0:
        return None
    return (
        f"tensor parallelism over {value} ranks needs a training world that is a multiple "
        f"of {value}; cluster.num_nodes x cluster.gpus_per_node (processes per node on CPU) "
        f"= {world}"
    )


def _replicas_divide_dp(value: int, context: SupportContext) -> str | None:
    """HSDP: the data-parallel ranks (the training ranks over TP) split into ``value``
    replicas of one shard group each; NeMo RL builds it on its v2 DTensor worker only."""
    if value == 1:
        return None
    if not context.section_value("dtensor_cfg.v2"):
        return "HSDP needs NeMo RL's v2 DTensor worker, as there: set dtensor_cfg._v2: true"
    dp = training_ranks(context) // (context.section_value(_TP) or 1)
    if dp % value == 0:
        return None
    return (
        f"HSDP splits the data-parallel ranks into {value} replicas, and there are {dp} "
        f"(cluster.num_nodes x cluster.gpus_per_node / {_TP}); set it to a divisor of {dp}"
    )


def _sequence_parallel(value: bool, context: SupportContext) -> str | None:
    """Sequence parallelism splits the activations between the tensor-parallel regions
    (``sharding.shard_model``): without TP there are none (NeMo RL ignores it too), and a
    custom plan lays them out with its own styles."""
    if not value or (context.section_value(_TP) or 1) == 1:
        return None
    if context.section_value("dtensor_cfg.custom_parallel_plan") is not None:
        return (
            "dtensor_cfg.custom_parallel_plan lays out the activations with its own styles: "
            "set it false and give SequenceParallel styles in the plan"
        )
    return None


# NeMo Automodel's loader options this loader matches: transformers' own model classes
# (force_hf: true asks for them; without it Automodel may swap in its own kernels for the
# same architecture, which are not built here), no Liger kernels, and the attention
# implementation handed to from_pretrained.
AUTOMODEL_KWARGS_HERE: dict[str, tuple[Any, ...]] = {
    "force_hf": (True, False),
    "use_liger_kernel": (False,),
    "attn_implementation": ("sdpa", "eager"),
}


def _automodel_kwargs_here(kwargs: dict[str, Any], context: SupportContext) -> str | None:
    for name, value in kwargs.items():
        allowed = AUTOMODEL_KWARGS_HERE.get(name)
        if allowed is None:
            return (
                f"{name}: an option of NeMo Automodel's loader; models load through "
                "transformers here (policy.hf_config_overrides sets model config values)"
            )
        if value not in allowed:
            return f"{name}={value!r}: this loader takes {', '.join(map(repr, allowed))}"
    return None


class DTensorConfig(StrictModel):
    """NeMo RL's FSDP2/DTensor worker, which the HF backend is with one rank. While Megatron
    trains, NeMo RL reads none of it but ``enabled``."""

    read_while: ClassVar[ReadWhile] = ReadWhile(
        lambda section, context: context.sibling_value("training_backend") == "hf"
    )

    enabled: Annotated[
        bool, Check(_dtensor_or_megatron, "true exactly when the HF backend trains")
    ] = True
    v2: Annotated[
        bool,
        inert(
            "which of NeMo RL's two DTensor workers; both compute the same training step, "
            "the one HF trainer here does too",
        ),
    ] = Field(True, alias="_v2")
    cpu_offload: Annotated[bool, gpu_memory_knob(False, "FSDP's CPU offload of parameters")] = False
    sequence_parallel: Annotated[
        bool,
        Check(
            _sequence_parallel,
            "activations split along the sequence between TP regions (sharding.shard_model)",
        ),
    ] = False
    activation_checkpointing: Annotated[bool, Wired(f"{_TRAINER}.__init__")] = False
    tensor_parallel_size: Annotated[
        int,
        Check(
            _tp_divides_world,
            "the tp dim of the training ranks' mesh (sharding.shard_model); must divide them",
        ),
    ] = Field(1, ge=1)
    context_parallel_size: Annotated[
        int, Only(1, reason=f"context parallelism is not built: {_ONE_PROCESS}")
    ] = Field(1, ge=1)
    custom_parallel_plan: Annotated[str | None, PartOf(_TP)] = None
    dp_replicate_size: Annotated[
        int,
        Check(
            _replicas_divide_dp,
            "HSDP's replica count (sharding.shard_model); must divide the data-parallel ranks",
        ),
    ] = Field(1, ge=1)
    expert_parallel_size: Annotated[
        int,
        Only(1, reason=f"expert parallelism (MoE) is not built here: {_ONE_PROCESS}"),
    ] = Field(1, ge=1)
    # NeMo Automodel's MoEParallelizerConfig options (how FSDP wraps MoE layers, the LM
    # head's precision): an MoE model sharded over several ranks.
    moe_parallelizer: Annotated[
        dict[str, Any] | None,
        Only(
            None,
            {},
            reason=f"NeMo Automodel's MoE parallelizer shards experts over ranks; {_ONE_PROCESS}",
        ),
    ] = None
    # Every n-th microbatch frees the CUDA cache; None or 0: never.
    clear_cache_every_n_steps: Annotated[int | None, Wired(f"{_TRAINER}._train")] = Field(
        None, ge=0
    )
    # Set in the stage's process while the run's models live (NeMo RL: the worker's).
    env_vars: Annotated[
        dict[str, str] | None, Wired("nemo_rl_core.pipeline.runtime:training_env_vars")
    ] = None
    lora_cfg: LoraConfig | None = None
    automodel_kwargs: Annotated[
        dict[str, Any],
        Check(
            _automodel_kwargs_here,
            "force_hf, use_liger_kernel: false and attn_implementation (sdpa, eager); "
            "NeMo Automodel's other loader options refused",
        ),
    ] = Field(default_factory=dict)


_DRAFT = "policy.draft.enabled"


def attention_implementation(config: "TrainedModelConfig") -> str:
    """The attention ``from_pretrained`` builds: ``automodel_kwargs.attn_implementation``,
    else PyTorch's scaled-dot-product attention."""
    return str(config.dtensor_cfg.automodel_kwargs.get("attn_implementation", "sdpa"))


def _draft_trains_here(value: bool, context: SupportContext) -> str | None:
    if not value:
        return None
    if not context.key.startswith("policy."):
        return "only the policy trains a draft head; this model is never trained"
    if context.section_value("megatron_cfg.enabled"):
        return (
            "the draft head trains beside the HF backend's policy; Megatron-core's EAGLE "
            "training is not built"
        )
    return None


class DraftConfig(StrictModel):
    """``policy.draft``: an Eagle-style draft head trained beside the policy
    (:mod:`nemo_rl_core.models.policy.draft`)."""

    read_while: ClassVar[ReadWhile] = ReadWhile(read_while_enabled)

    enabled: Annotated[
        bool,
        Check(_draft_trains_here, "the HF policy trains a draft head beside it"),
    ] = False
    model_name: Annotated[
        str | None,
        Only(
            None,
            reason="a pretrained EAGLE draft is not loaded here: the draft head starts from a "
            "seeded random init and trains beside the policy",
        ),
    ] = None
    loss_weight: Annotated[float, Field(ge=0.0), PartOf(_DRAFT)] = 0.1
    num_layers: Annotated[
        int | None, Only(None, 1, reason="the draft head here is one fused block")
    ] = None
    aux_layer_indices: Annotated[list[int] | None, PartOf(_DRAFT)] = None


class RewardModelConfig(StrictModel):
    """``policy.reward_model_cfg``: the policy is a scalar-head reward model (HF
    ``*ForSequenceClassification`` with one label) trained on preference pairs."""

    enabled: Annotated[bool, Wired("nemo_rl_core.models.policy.hf_policy:HFPolicy")] = False
    # NeMo RL supports Bradley-Terry only (PreferenceLossFn)
    reward_model_type: Annotated[
        Literal["bradley_terry"], Wired("nemo_rl_core.algorithms.rm:RMMasterConfig")
    ] = "bradley_terry"


class RouterReplayConfig(StrictModel):
    """``policy.router_replay``: NeMo RL replays the experts vLLM routed each token to in
    Megatron's MoE layers, so training sees the routing generation used."""

    enabled: Annotated[
        bool,
        Only(
            False,
            reason="router replay needs mixture-of-experts layers, and MoE models are not "
            "built here (the Megatron converter builds dense models)",
        ),
    ] = False


_QUANT = "quant_cfg"  # from the section of the model it belongs to


class TrainedModelConfig(StrictModel):
    """The keys every trained HF model shares (policy and value): model, batches, optimizer."""

    model_name: Annotated[str, Wired("nemo_rl_core.pipeline.runtime:RunRuntime")]
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    train_global_batch_size: Annotated[int, Wired(f"{_TRAINER}.train")] = Field(ge=1)
    train_micro_batch_size: Annotated[int, Wired(f"{_TRAINER}.train")] = Field(ge=1)
    # None: train_micro_batch_size
    logprob_batch_size: Annotated[int | None, Wired(f"{_TRAINER}.map_microbatches")] = Field(
        None, ge=1
    )
    max_total_sequence_length: Annotated[int, Wired(f"{_TRAINER}.check_inputs")] = Field(ge=2)
    precision: Annotated[Literal["float32", "bfloat16"], Wired(f"{_TRAINER}.autocast")] = "bfloat16"
    hf_config_overrides: Annotated[
        dict[str, Any], Wired("nemo_rl_core.models.policy.hf_loading:load_pretrained")
    ] = Field(default_factory=dict)
    # null in NeMo RL's Megatron YAMLs: megatron_cfg.optimizer serves that backend
    optimizer: OptimizerConfig | None = Field(default_factory=OptimizerConfig)
    scheduler: Annotated[list[SchedulerEntry] | SchedulerConfig | None, Field()] = None
    # The HF backend's clipping norm; Megatron's is megatron_cfg.optimizer.clip_grad.
    max_grad_norm: Annotated[float | None, Wired(f"{_TRAINER}._clip_and_step")] = 1.0
    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig)
    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    make_sequence_length_divisible_by: Annotated[int, Wired(f"{_TRAINER}.layout")] = Field(1, ge=1)
    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    megatron_cfg: MegatronConfig | None = None
    training_backend: Annotated[
        Literal["hf", "megatron"], Wired("nemo_rl_core.models.policy:make_policy")
    ] = "hf"

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

    def check_torch_classes(self, section: str) -> None:
        """The optimizer's and schedulers' ``kwargs`` against their classes' parameters, so
        a typo fails now, not at the first training step. This imports torch, so the config
        check runs it after every check that does not (``flows.config_check``)."""
        from nemo_rl_core.models.policy.utils import check_kwargs_accepted, import_class_from_path

        named: list[tuple[str, Any]] = [
            ("optimizer", self.optimizer),
            ("scheduler", self.scheduler),
        ]
        if isinstance(self.scheduler, list):
            named[1:] = [(f"scheduler.{i}", entry) for i, entry in enumerate(self.scheduler)]
        for key, entry in named:
            if not isinstance(entry, OptimizerConfig | SchedulerConfig):
                continue
            try:
                check_kwargs_accepted(import_class_from_path(entry.name), entry.kwargs, skip=1)
            except ValueError as err:
                raise ConfigError(f"{section}.{key}: {err}") from None


class PolicyConfig(TrainedModelConfig):
    """NeMo RL's ``policy:`` section."""

    # NeMo RL's configs say "only used when generating using HF backend": prompts per
    # transformers generate call (all at once when unset); vLLM schedules its own batches.
    generation_batch_size: Annotated[
        int | None, Wired("nemo_rl_core.models.generation.hf_generation:HFGeneration.generate")
    ] = Field(None, ge=1)
    logprob_chunk_size: Annotated[
        int | None,
        inert(
            "splits NeMo RL's float32 logits along the sequence to save memory, the same "
            "logprobs; here only the wanted positions reach the LM head",
        ),
    ] = Field(None, ge=1)
    offload_optimizer_for_logprob: Annotated[
        bool,
        Wired("nemo_rl_core.models.policy.hf_policy:HFPolicy.prepare_for_lp_inference"),
    ] = False
    refit_buffer_size_gb: Annotated[
        float | None,
        inert(
            "the chunk size of NeMo RL's weight transfer between processes; the engine here "
            "is refit in its own process from the whole state dict, the same weights",
        ),
    ] = Field(None, gt=0)
    generation: GenerationConfig | None = None
    draft: DraftConfig = Field(default_factory=DraftConfig)
    reward_model_cfg: RewardModelConfig = Field(default_factory=RewardModelConfig)
    activation_checkpointing_enabled: Annotated[
        bool,
        inert(
            "NeMo RL v0.7 reads it nowhere (rm.yaml keeps it); "
            "dtensor_cfg.activation_checkpointing is the switch",
        ),
    ] = False
    router_replay: RouterReplayConfig = Field(default_factory=RouterReplayConfig)
    dequantize_base_checkpoint: Annotated[
        bool,
        Only(
            False,
            reason="NeMo Automodel's dequantization of a quantized base checkpoint (gpt-oss's "
            "MXFP4 experts) is not built; load a bfloat16 checkpoint",
        ),
    ] = False
    # NeMo RL's ModelOpt quantization-aware training: a ModelOpt recipe name, then its
    # calibration data and sizes.
    quant_cfg: Annotated[
        str | None,
        Only(None, reason="ModelOpt quantization-aware training is not built here"),
    ] = None
    quant_calib_data: Annotated[str | None, PartOf(_QUANT)] = None
    quant_calib_size: Annotated[int | None, PartOf(_QUANT)] = None
    quant_batch_size: Annotated[int | None, PartOf(_QUANT)] = None
    quant_sequence_length: Annotated[int | None, PartOf(_QUANT)] = None
    disable_modelopt_layer_spec: Annotated[bool, PartOf(_QUANT)] = False

    @model_validator(mode="after")
    def _reward_model_backend(self) -> Self:
        if self.reward_model_cfg.enabled and self.training_backend != "hf":
            raise ValueError(
                "reward_model_cfg.enabled: the scalar-head reward model trains on the hf "
                "backend; the Megatron backend here trains language models only"
            )
        return self
