"""The config of a GRPO run (NeMo RL's ``nemo_rl.algorithms.grpo.MasterConfig`` and its
sections), apart from the work of its stages (:mod:`nemo_rl_core.algorithms.grpo`, which
re-exports these names by NeMo RL's paths): the config check imports it without torch.
"""

from abc import abstractmethod
from typing import Annotated, Any, ClassVar, Self

from pydantic import Field, field_validator, model_validator

from nemo_rl_core.algorithms.config import (
    ClippedPGLossConfig,
    GRPOAdvantageConfig,
    clipped_pg_config_problems,
)
from nemo_rl_core.algorithms.reward_config import (
    RewardScalingConfig,
    RewardShapingConfig,
    reward_shaping_config_problems,
)
from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.config.checkpointing import CheckpointingConfig
from nemo_rl_core.config.cluster import ClusterConfig
from nemo_rl_core.config.logger import LoggerConfig
from nemo_rl_core.config.orchestration import OrchestrationConfig
from nemo_rl_core.data.config import SFT_DATASETS, SFT_PROCESSOR, DataConfig
from nemo_rl_core.data.datasets.builder import (
    DEFAULT_COUNTS,
    SPLITS,
    DataSetup,
    dataset_environments,
    games_from_environment,
    processor_name,
)
from nemo_rl_core.environments.utils import (
    ENVIRONMENTS_BUILT,
    NOT_BUILT_ENVIRONMENTS,
    UnknownEnvironmentError,
    check_env_config,
    environments_not_built,
    is_registered_env,
    registered_env_section,
)
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.utils.config import load_config_file
from nemo_rl_core.utils.key_support import (
    Check,
    Only,
    PartOf,
    ReadWhile,
    SupportContext,
    TypedSections,
    Wired,
    read_while_enabled,
)

_GRPO = "nemo_rl_core.algorithms.grpo"
_GENERATION = "nemo_rl_core.algorithms.rollout_generation"
_PROMPTS = "nemo_rl_core.algorithms.prompt_batches"
_SCHEDULE = "nemo_rl_core.algorithms.schedule"
_SCORING = "nemo_rl_core.algorithms.scoring"
_VALIDATION = "nemo_rl_core.algorithms.validation"


def _needs_cuda(value: bool, context: SupportContext) -> str | None:
    if value and context.machine.cuda_devices == 0:
        return "computing advantages on the GPU needs a CUDA device; this machine has none"
    return None


class RolloutScheduleConfig(StrictConfig):
    """The loop keys every algorithm that generates shares (``grpo:``, ``ppo:``,
    ``distillation:``; NeMo RL's names and defaults): how many prompts and samples per step,
    how many steps, validation, the seed."""

    num_prompts_per_step: Annotated[int, Field(ge=1), Wired(f"{_PROMPTS}:make_dataloader")]
    num_generations_per_prompt: Annotated[int, Field(ge=1), Wired(f"{_PROMPTS}:take_prompts")] = 1
    max_rollout_turns: Annotated[int, Field(ge=1), Wired(f"{_GENERATION}:play_rollouts")] = 1
    max_num_epochs: Annotated[int, Field(ge=1), Wired(f"{_SCHEDULE}:planned_steps")] = 1
    max_num_steps: Annotated[int, Field(ge=1), Wired(f"{_SCHEDULE}:planned_steps")]
    val_period: Annotated[int, Wired(f"{_SCHEDULE}:validation_due")] = 0  # <= 0: never
    # None: every validation prompt in one batch (NeMo RL allows None for NeMo-Gym).
    val_batch_size: Annotated[int | None, Field(ge=1), Wired(f"{_VALIDATION}:validate_batches")] = (
        None
    )
    val_at_start: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = False
    val_at_end: Annotated[bool, Wired(f"{_SCHEDULE}:validation_due")] = False
    max_val_samples: Annotated[
        int | None, Field(ge=1), Wired(f"{_VALIDATION}:validate_batches")
    ] = None
    seed: Annotated[int, Wired(f"{_GENERATION}:sampling_seeds")] = 42
    # Not in NeMo RL: a reward checker that raised, hung or died gives reward 0; past this
    # fraction of the batch the reward stage fails instead of training on broken rewards.
    max_env_failure_fraction: Annotated[
        float, Field(ge=0.0, le=1.0), Wired(f"{_SCORING}:score_rollouts")
    ] = 0.5

    @model_validator(mode="after")
    def _whole_validation_batches(self) -> Self:
        """NeMo RL validates ``max_val_samples // val_batch_size`` whole batches."""
        limit, size = self.max_val_samples, self.val_batch_size
        if limit is not None and size is not None and limit < size:
            raise ValueError(
                f"max_val_samples ({limit}) is smaller than val_batch_size ({size}): "
                "no whole validation batch fits, so nothing would be validated"
            )
        return self


class RolloutLoopConfig(RolloutScheduleConfig):
    """The loop keys ``grpo:`` and ``ppo:`` share beyond the schedule: the forwards they
    skip and what happens to rewards and samples between scoring and the advantages."""

    skip_reference_policy_logprobs_calculation: Annotated[
        bool, Wired(f"{_GRPO}:compute_logprobs")
    ] = False
    # What happens to rewards and samples between scoring and the advantages.
    overlong_filtering: Annotated[bool, Wired(f"{_GRPO}:process_rewards")] = False
    use_dynamic_sampling: Annotated[bool, Wired(f"{_GRPO}:select_prompt_groups")] = False
    dynamic_sampling_max_gen_batches: Annotated[
        int, Field(ge=1), Wired(f"{_GRPO}:select_prompt_groups")
    ] = 10
    batch_multiplier: Annotated[float, Field(gt=0), Wired(f"{_PROMPTS}:prompts_per_batch")] = 1.0
    calculate_advantages_on_gpu: Annotated[
        bool, Check(_needs_cuda, "the advantages are computed on the GPU, which must be there")
    ] = False
    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig)
    reward_scaling: RewardScalingConfig = Field(default_factory=RewardScalingConfig)

    @model_validator(mode="after")
    def _multiplier_with_dynamic_sampling(self) -> Self:
        if self.batch_multiplier != 1 and not self.use_dynamic_sampling:
            raise ValueError(
                f"batch_multiplier={self.batch_multiplier} needs use_dynamic_sampling: true "
                "(NeMo RL: it sizes the generation batches that dynamic sampling filters)"
            )
        return self

    @field_validator("reward_shaping")
    @classmethod
    def _reward_shaping_is_usable(cls, shaping: RewardShapingConfig) -> RewardShapingConfig:
        """What reward shaping would refuse at the first reward stage, refused now."""
        problems = reward_shaping_config_problems(shaping)
        if problems:
            raise ValueError("; ".join(problems))
        return shaping


_ONE_VERSION_PER_BATCH = (
    "each generated batch comes from one recorded weights version (the checkpoint "
    "max_trajectory_age_steps before its step), so that a resumed run or a rerun stage "
    "generates it again bit for bit; updating weights in the middle of a batch would mix "
    "versions"
)


class AsyncGRPOConfig(StrictConfig):
    """``grpo.async_grpo:`` the rollouts (prompts, generate, reward) of the next
    ``max_trajectory_age_steps`` steps run while this step trains; step i's batch is
    generated from the weights of step i - max_trajectory_age_steps (NeMo RL's bound on a
    trajectory's age, reached by every batch here, so the schedule does not depend on
    timing)."""

    read_while: ClassVar[ReadWhile] = ReadWhile(read_while_enabled)

    enabled: Annotated[bool, Wired(f"{_SCHEDULE}:async_depth")] = False
    max_trajectory_age_steps: Annotated[int, PartOf("grpo.async_grpo.enabled")] = 1
    in_flight_weight_updates: Annotated[bool, Only(False, reason=_ONE_VERSION_PER_BATCH)] = False
    recompute_kv_cache_after_weight_updates: Annotated[
        bool, Only(False, reason=_ONE_VERSION_PER_BATCH)
    ] = False

    @field_validator("max_trajectory_age_steps")
    @classmethod
    def _at_least_one_step(cls, steps: int) -> int:
        if steps < 1:
            raise ValueError(
                f"is {steps}: a trajectory is at least one step old when generation overlaps "
                "training (1 overlaps the next step's generation with this step's training)"
            )
        return steps


_NO_TOOL_PARSING = (
    "this deployment's environments do not parse tool calls or <think> tags, so there are no "
    "such tokens to give an advantage to"
)


class GRPOConfig(GRPOAdvantageConfig, RolloutLoopConfig):
    """``grpo:``: NeMo RL's keys and defaults (advantage and loop keys inherited)."""

    num_generations_per_prompt: Annotated[int, Field(ge=1), Wired(f"{_PROMPTS}:take_prompts")]
    async_grpo: AsyncGRPOConfig = Field(default_factory=AsyncGRPOConfig)
    seq_logprob_error_threshold: Annotated[
        float | None, Field(gt=0), Wired(f"{_GRPO}:mask_by_sequence_logprob_error")
    ] = None
    invalid_tool_call_advantage: Annotated[float | None, Only(None, reason=_NO_TOOL_PARSING)] = None
    malformed_thinking_advantage: Annotated[float | None, Only(None, reason=_NO_TOOL_PARSING)] = (
        None
    )


_DATA_PLANE = "data_plane.enabled"


class DataPlaneConfig(StrictConfig):
    """NeMo RL's ``data_plane:`` (a TransferQueue between Ray actors). Here object storage
    is the data plane: every stage's outputs are stored batches the next stage reads."""

    enabled: Annotated[
        bool,
        Only(
            False,
            reason="the TransferQueue data plane moves batches between Ray actors; in this "
            "deployment the stages hand batches over through the run's object storage",
        ),
    ] = False
    impl: Annotated[str, PartOf(_DATA_PLANE)] = "transfer_queue"
    backend: Annotated[str, PartOf(_DATA_PLANE)] = "simple"
    storage_capacity: Annotated[int, PartOf(_DATA_PLANE)] = 1_000_000
    num_storage_units: Annotated[int, PartOf(_DATA_PLANE)] = 2
    claim_meta_poll_interval_s: Annotated[float, PartOf(_DATA_PLANE)] = 0.5
    global_segment_size: Annotated[int, PartOf(_DATA_PLANE)] = 0
    local_buffer_size: Annotated[int, PartOf(_DATA_PLANE)] = 0
    observability: Annotated[dict[str, Any] | None, PartOf(_DATA_PLANE)] = None


def _named_environments_not_built(env: dict[str, Any], context: SupportContext) -> str | None:
    """:func:`environments_not_built` of the sections a dataset of the run names: NeMo RL
    builds only those, so a section no dataset names is never read (its DAPO recipes keep an
    ``env.dapo``)."""
    named = dataset_environments(context.value("data"), env)
    return environments_not_built({name: env[name] for name in env if name in named})


NEMO_GYM_SWITCHES = ("should_use_nemo_gym", "should_log_nemo_gym_responses")
"""NeMo RL's two switches beside the environment sections of ``env:``."""


class RolloutMasterConfig(StrictConfig):
    """The sections of every algorithm whose policy generates and whose environments score
    (GRPO, PPO, on-policy distillation); ``algorithm`` is its own section (``grpo:``,
    ``ppo:``, ``distillation:``), which the shared rollout stages read."""

    policy: PolicyConfig
    data: DataConfig
    env: Annotated[
        dict[str, dict[str, Any]],
        Check(_named_environments_not_built, f"{ENVIRONMENTS_BUILT} (those a dataset names)"),
        TypedSections(registered_env_section),
    ] = Field(default_factory=dict)
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)

    @property
    @abstractmethod
    def algorithm(self) -> RolloutScheduleConfig: ...

    @model_validator(mode="before")
    @classmethod
    def _nemo_gym_is_off(cls, data: Any) -> Any:
        """NeMo RL keeps two switches beside the environment sections:
        ``env.should_use_nemo_gym`` sends rollouts through NeMo Gym, which is not built here,
        so it is refused on; off, it and ``env.should_log_nemo_gym_responses`` (read only on
        NeMo Gym's path, in NeMo RL as well) change nothing, and leave the sections alone."""
        env = data.get("env") if isinstance(data, dict) else None
        if not isinstance(env, dict) or not set(NEMO_GYM_SWITCHES) & env.keys():
            return data
        if env.get("should_use_nemo_gym"):
            raise ValueError(
                "env.should_use_nemo_gym: NeMo Gym rollouts (its environments, served "
                "through the generation engine's HTTP server) are not built here; set it "
                "to false and name a built environment (math, code, ...) under env:"
            )
        sections = {name: value for name, value in env.items() if name not in NEMO_GYM_SWITCHES}
        return {**data, "env": sections}

    @model_validator(mode="after")
    def _datasets_are_prompts(self) -> Self:
        """SFT conversations (``sft_processor``, ``addition_sft``) hold their answers: there
        is nothing left to generate and score. (A puzzle run reads no dataset of ``data:``.)"""
        if games_from_environment(self.data, self.env):
            return self
        for split in SPLITS:
            for index, dataset in enumerate(self.data.datasets(split)):
                if dataset.dataset_name in SFT_DATASETS or processor_name(dataset) == SFT_PROCESSOR:
                    raise ValueError(
                        f"data.{split}[{index}]: {dataset.dataset_name or SFT_PROCESSOR} makes "
                        "SFT conversations, not prompts to generate from; use "
                        "math_data_processor (or the addition dataset) here, and flows.sft to "
                        "train on conversations"
                    )
        return self

    @model_validator(mode="after")
    def _environments_are_known(self) -> Self:
        """Each ``env.<name>`` section validates into its environment's own config now,
        not when the first rollout reaches the environment. NeMo RL builds only the
        environments its datasets name, so a section of an unknown environment that no
        dataset names loads (NeMo RL's DAPO recipes keep an ``env.dapo``) and is not read."""
        named = dataset_environments(self.data, self.env)
        for name, settings in self.env.items():
            if name in NOT_BUILT_ENVIRONMENTS or (
                name not in named and not is_registered_env(name)
            ):
                continue  # refused by the env key's rule, before any work
            try:
                check_env_config(name, settings)
            except UnknownEnvironmentError as err:
                raise ValueError(f"env.{name}: {err}") from None
        return self


class RLMasterConfig(RolloutMasterConfig):
    """The sections every policy-gradient algorithm's YAML shares (GRPO, PPO): the rollout
    sections plus the clipped policy-gradient loss."""

    loss_fn: ClippedPGLossConfig = Field(default_factory=ClippedPGLossConfig)
    data_plane: DataPlaneConfig | None = None
    on_policy_distillation: Annotated[
        dict[str, Any] | None,
        Only(
            None,
            reason="multi-teacher on-policy distillation through NeMo-Gym teachers is not "
            "built in this deployment",
        ),
    ] = None

    @property
    @abstractmethod
    def algorithm(self) -> RolloutLoopConfig: ...

    @model_validator(mode="after")
    def _loss_knobs_fit_together(self) -> Self:
        """NeMo RL's checks of ``loss_fn:`` combinations, reported by key before any work."""
        loss = self.loss_fn
        problems = [(f"loss_fn.{key}", why) for key, why in clipped_pg_config_problems(loss)]
        if loss.truncated_importance_sampling_ratio is not None and (
            loss.truncated_importance_sampling_type is None
        ):
            problems.append(
                (
                    "loss_fn.truncated_importance_sampling_type",
                    "is null while truncated_importance_sampling_ratio is set: name the "
                    "truncation (tis, icepop or seq-mask-tis)",
                )
            )
        threshold = getattr(self.algorithm, "seq_logprob_error_threshold", None)
        if loss.force_on_policy_ratio and threshold is not None:
            problems.append(
                (
                    "loss_fn.force_on_policy_ratio",
                    "skips the prev_logprobs that seq_logprob_error_threshold masks by; "
                    "unset one of them",
                )
            )
        if problems:
            raise ValueError("; ".join(f"{key}: {why}" for key, why in problems))
        return self

    @model_validator(mode="after")
    def _skipped_forwards_are_unused(self) -> Self:
        """NeMo RL's checks of the two forward shortcuts of the logprob stage: each is
        exact only when nothing reads what it no longer computes."""
        loop, loss = self.algorithm, self.loss_fn
        section = type(loop).__name__.removesuffix("Config").lower()
        if loss.force_on_policy_ratio:
            samples = loop.num_prompts_per_step * loop.num_generations_per_prompt
            if self.policy.train_global_batch_size != samples:
                raise ValueError(
                    "loss_fn.force_on_policy_ratio needs one optimizer step per batch: "
                    f"policy.train_global_batch_size={self.policy.train_global_batch_size} "
                    f"must equal {section}.num_prompts_per_step x num_generations_per_prompt"
                    f" = {samples}"
                )
            if loss.use_kl_in_reward and loss.reference_policy_kl_penalty != 0:
                raise ValueError(
                    "loss_fn.force_on_policy_ratio skips the policy forward whose "
                    "prev_logprobs loss_fn.use_kl_in_reward reads for its KL reward; "
                    "set one of them to false"
                )
        if loop.skip_reference_policy_logprobs_calculation and loss.reference_policy_kl_penalty:
            raise ValueError(
                f"{section}.skip_reference_policy_logprobs_calculation needs "
                "loss_fn.reference_policy_kl_penalty: 0 "
                f"(got {loss.reference_policy_kl_penalty}): the KL term reads them"
            )
        return self


class MasterConfig(RLMasterConfig):
    """The whole YAML of a GRPO run."""

    grpo: GRPOConfig

    @property
    def algorithm(self) -> GRPOConfig:
        return self.grpo

    @model_validator(mode="after")
    def _async_fits_the_run(self) -> Self:
        """What NeMo RL's ``async_grpo_train`` asserts or refuses, reported by key before any
        work: stale samples need the importance-sampling correction, and the DAPO features
        that filter or reshape a step's batch do not run asynchronously."""
        if not self.grpo.async_grpo.enabled:
            return self
        problems = []
        if not self.loss_fn.use_importance_sampling_correction:
            problems.append(
                "loss_fn.use_importance_sampling_correction: must be true with "
                "grpo.async_grpo.enabled (samples generated from older weights are weighed "
                "by pi_old / pi_gen, as NeMo RL requires)"
            )
        dapo = {
            "grpo.use_dynamic_sampling": self.grpo.use_dynamic_sampling,
            "grpo.reward_scaling.enabled": self.grpo.reward_scaling.enabled,
            "grpo.reward_shaping.enabled": self.grpo.reward_shaping.enabled,
        }
        problems += [
            f"{key}: not supported with grpo.async_grpo.enabled (as in NeMo RL)"
            for key, on in dapo.items()
            if on
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self


def load_master_config(
    config_path: str,
    overrides: list[str] | None = None,
    config_class: type[RLMasterConfig] = MasterConfig,
) -> RLMasterConfig:
    """Load, override and validate a GRPO YAML (or ``config_class``'s, e.g. PPO's); errors
    name the file or the key path. Relative input files of ``data:`` are made absolute
    from the config file's directory (``DataConfig.with_files_from``)."""
    return load_config_file(config_path, overrides, config_class)


def data_setup(config: RolloutMasterConfig) -> DataSetup:
    """What the run's datasets take from outside ``data:``: the environments (the sliding
    puzzle's games), NeMo RL's puzzle-runner sizes and the policy's sequence length."""
    loop = config.algorithm
    games = loop.num_prompts_per_step * loop.num_generations_per_prompt * loop.max_num_steps
    return DataSetup(
        env=config.env,
        puzzle_counts={
            "train": games,
            "validation": loop.max_val_samples or DEFAULT_COUNTS["validation"],
        },
        max_seq_length=config.policy.max_total_sequence_length,
    )
